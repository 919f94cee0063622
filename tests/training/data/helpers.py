"""Small indexed datasets for the tests: every token is its own global position (all unique)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.text.indexed_dataset import IndexedDatasetWriter


def write_unique_dataset(
    prefix: Path, n_docs: int, max_len: int, seed: int = 0, base: int = 0
) -> list[np.ndarray]:
    """Documents of random length (some empty); each token is base + its position in the file."""
    rng = np.random.default_rng(seed)
    docs, pos = [], base
    with IndexedDatasetWriter(prefix, np.int32) as w:
        for _ in range(n_docs):
            n = int(rng.integers(0, max_len))
            doc = np.arange(pos, pos + n)
            w.add_document(doc)
            docs.append(doc)
            pos += n
    return docs
