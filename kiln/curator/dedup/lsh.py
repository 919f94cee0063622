"""LSH banding on Dask: band keys -> buckets (one shuffle) -> candidate pairs.

Each bucket links its members to its anchor (the member with the smallest id), as NeMo Curator's
buckets-to-edges does; connected components later join what the anchors link."""

from __future__ import annotations

import numpy as np
import pandas as pd

PAIR_META = pd.DataFrame(
    {
        "a_row": pd.Series([], dtype="int64"),
        "a_id": pd.Series([], dtype="object"),
        "b_row": pd.Series([], dtype="int64"),
        "b_id": pd.Series([], dtype="object"),
    }
)


def _bucket_pairs(df: pd.DataFrame, max_bucket: int) -> pd.DataFrame:
    df = df.sort_values(["bucket", "id", "_row"])
    df = df[df["bucket"].duplicated(keep=False)]
    if df.empty:
        return PAIR_META.copy()
    first = ~df["bucket"].duplicated()
    rank = df.groupby("bucket").cumcount()
    anchor_row = df["_row"].where(first).ffill().astype("int64")
    anchor_id = df["id"].where(first).ffill()
    member = (~first) & (rank < max_bucket)
    out = pd.DataFrame(
        {
            "a_row": anchor_row[member].to_numpy(),
            "a_id": anchor_id[member].to_numpy(),
            "b_row": df["_row"][member].to_numpy(),
            "b_id": df["id"][member].to_numpy(),
        }
    )
    return out.astype({"a_id": "object", "b_id": "object"})


def _unique_pairs(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop_duplicates(subset=["a_row", "b_row"]).sort_values(["a_row", "b_row"])


def _long(df: pd.DataFrame, band_cols: list[str]) -> pd.DataFrame:
    """One row per (document, band): band keys already differ between bands."""
    n = len(band_cols)
    return pd.DataFrame(
        {
            "_row": np.repeat(df["_row"].to_numpy(), n),
            "id": np.repeat(df["id"].to_numpy(), n),
            "bucket": df[band_cols].to_numpy().reshape(-1),
        }
    )


def candidate_pairs(ddf, band_cols: list[str], max_bucket: int = 1000):
    """Dask frame of (a_row, a_id, b_row, b_id) candidate pairs, each pair once."""
    meta = pd.DataFrame(
        {
            "_row": pd.Series([], dtype="int64"),
            "id": pd.Series([], dtype="object"),
            "bucket": pd.Series([], dtype="int64"),
        }
    )
    long = ddf[["_row", "id", *band_cols]].map_partitions(_long, band_cols, meta=meta)
    pairs = long.shuffle(on="bucket").map_partitions(_bucket_pairs, max_bucket, meta=PAIR_META)
    return pairs.shuffle(on="b_row").map_partitions(_unique_pairs, meta=PAIR_META)
