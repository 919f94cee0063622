"""Exact dedup on Dask: shuffle by text hash, keep the smallest id of each hash."""

from __future__ import annotations

import pandas as pd


def _duplicates_in_partition(df: pd.DataFrame) -> pd.DataFrame:
    df = df.sort_values(["_hash", "id", "_row"])
    return df.loc[df["_hash"].duplicated(), ["_row"]]


def exact_duplicate_rows(ddf) -> pd.Series:
    """`_row` keys of every document whose text hash an earlier (smaller-id) document has."""
    keys = ddf[["_hash", "id", "_row"]].shuffle(on="_hash")
    meta = pd.DataFrame({"_row": pd.Series([], dtype="int64")})
    dups = keys.map_partitions(_duplicates_in_partition, meta=meta).compute()
    return pd.Series(sorted(dups["_row"].to_numpy()), dtype="int64")
