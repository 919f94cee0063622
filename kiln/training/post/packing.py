"""Sequence packing: first-fit-decreasing of documents into rows of `seq_len` positions.

A document of L tokens fills L - 1 positions (inputs `tokens[:-1]`, labels `tokens[1:]`), so a
row of `seq_len` positions holds documents of up to `seq_len + 1` tokens, as a pretraining sample
spans `seq_len + 1` tokens. Inside a row each document keeps its own positions (restarting at 0)
and its own document id, and attention never crosses documents (`packed_attention`).

First fit finds the leftmost row with room through a max-segment tree over the rows' free
space: O(n log n) for n documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PackingReport:
    documents: int
    rows_unpacked: int
    rows_packed: int
    positions_used: int
    seq_len: int

    @property
    def padding_unpacked(self) -> float:
        """Fraction of positions that are padding with one document per row."""
        return 1.0 - self.positions_used / max(1, self.rows_unpacked * self.seq_len)

    @property
    def padding_packed(self) -> float:
        return 1.0 - self.positions_used / max(1, self.rows_packed * self.seq_len)

    def as_dict(self) -> dict:
        return {
            "documents": self.documents,
            "seq_len": self.seq_len,
            "rows_unpacked": self.rows_unpacked,
            "rows_packed": self.rows_packed,
            "padding_unpacked": round(self.padding_unpacked, 4),
            "padding_packed": round(self.padding_packed, 4),
        }


def positions_needed(lengths: np.ndarray) -> np.ndarray:
    """Positions each document of `lengths` tokens fills in a row."""
    return np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)


def first_fit_decreasing(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """Indices of `sizes` grouped into bins of `capacity`: largest first, each into the leftmost
    bin with room. Every size must be <= capacity. Ties keep the input order (stable sort)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) and sizes.max() > capacity:
        raise ValueError(f"a document needs {int(sizes.max())} positions > capacity {capacity}")
    n = len(sizes)
    leaves = 1
    while leaves < max(n, 1):
        leaves *= 2
    free = [capacity] * (2 * leaves)  # max free space in each subtree; every bin starts empty
    bins: list[list[int]] = []
    for i in np.argsort(-sizes, kind="stable").tolist():
        need = int(sizes[i])
        node = 1
        while node < leaves:  # descend to the leftmost leaf with room
            node = 2 * node if free[2 * node] >= need else 2 * node + 1
        b = node - leaves
        if b == len(bins):
            bins.append([])
        bins[b].append(i)
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def pack(lengths: np.ndarray, seq_len: int) -> tuple[list[list[int]], PackingReport]:
    """Rows of document indices (documents of up to `seq_len + 1` tokens) and the report."""
    sizes = positions_needed(lengths)
    bins = first_fit_decreasing(sizes, seq_len)
    report = PackingReport(
        documents=len(sizes),
        rows_unpacked=len(sizes),
        rows_packed=len(bins),
        positions_used=int(sizes.sum()),
        seq_len=seq_len,
    )
    return bins, report
