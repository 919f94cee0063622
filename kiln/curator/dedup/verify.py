"""Jaccard verification of candidate pairs: true character n-gram Jaccard of both texts.

Only the texts of documents that appear in some pair are fetched (a filter per partition, no
shuffle of the corpus), then each pair's shingle sets are compared."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kiln.curator.dedup.shingles import jaccard, shingle_hashes


def _texts_of(df: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    return df[df["_row"].isin(rows)]


def pair_jaccard(pairs: pd.DataFrame, texts: pd.Series, ngram: int) -> np.ndarray:
    """Jaccard of each (a_row, b_row) pair; `texts` is indexed by `_row`."""
    rows = texts.index.to_numpy()
    h, doc = shingle_hashes(texts.tolist(), ngram)
    bounds = np.searchsorted(doc, np.arange(len(rows) + 1))
    sets = {r: np.unique(h[bounds[i] : bounds[i + 1]]) for i, r in enumerate(rows)}
    return np.array(
        [jaccard(sets[a], sets[b]) for a, b in zip(pairs["a_row"], pairs["b_row"], strict=True)]
    )


def verify_pairs(pairs: pd.DataFrame, texts_ddf, ngram: int, threshold: float) -> pd.DataFrame:
    """Keep candidate pairs whose true Jaccard is at least `threshold` (adds a `jaccard` column)."""
    if pairs.empty:
        return pairs.assign(jaccard=pd.Series([], dtype="float64"))
    rows = np.unique(np.concatenate([pairs["a_row"].to_numpy(), pairs["b_row"].to_numpy()]))
    needed = texts_ddf.map_partitions(_texts_of, rows, meta=texts_ddf._meta).compute()
    if hasattr(needed, "to_pandas"):
        needed = needed.to_pandas()
    texts = needed.set_index("_row")["text"]
    scores = pair_jaccard(pairs, texts, ngram)
    out = pairs.assign(jaccard=scores)
    return out[out["jaccard"] >= threshold].reset_index(drop=True)
