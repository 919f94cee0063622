"""A text's set of shingle hashes: what the tests compare documents with (true Jaccard)."""

from __future__ import annotations

import numpy as np

from kiln.curator.dedup.shingles import shingle_hashes


def shingle_set(text: str, n: int, seed: int = 0) -> np.ndarray:
    return np.unique(shingle_hashes([text], n, seed)[0])
