"""Jaccard verification of candidate pairs: join both texts, compare their shingle sets."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kiln.curator.dedup.lsh import PAIR_META
from kiln.curator.dedup.shingles import jaccard, shingle_hashes

VERIFIED_META = PAIR_META.assign(jaccard=pd.Series([], dtype="float64"))


def _jaccard_partition(df: pd.DataFrame, ngram: int, threshold: float) -> pd.DataFrame:
    if df.empty:
        return VERIFIED_META.copy()
    texts = pd.unique(pd.concat([df["a_text"], df["b_text"]], ignore_index=True))
    index = {t: i for i, t in enumerate(texts)}
    h, doc = shingle_hashes(list(texts), ngram)
    bounds = np.searchsorted(doc, np.arange(len(texts) + 1))
    sets = [np.unique(h[bounds[i] : bounds[i + 1]]) for i in range(len(texts))]
    scores = np.array(
        [jaccard(sets[index[a]], sets[index[b]]) for a, b in zip(df["a_text"], df["b_text"], strict=True)]
    )
    out = df[list(PAIR_META.columns)].assign(jaccard=scores)
    return out[out["jaccard"] >= threshold]


def verify_pairs(pairs, texts, ngram: int, threshold: float):
    """Keep candidate pairs whose true character n-gram Jaccard is at least `threshold`."""
    a = texts.rename(columns={"_row": "a_row", "text": "a_text"})
    b = texts.rename(columns={"_row": "b_row", "text": "b_text"})
    joined = pairs.merge(a, on="a_row").merge(b, on="b_row")
    return joined.map_partitions(_jaccard_partition, ngram, threshold, meta=VERIFIED_META)
