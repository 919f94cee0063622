"""Repeated 64-bit hashes found with bounded memory: (hash, key) pairs are spilled to files by
hash prefix, and each file is read alone to find the keys whose hash occurred before.

Keys are positions in corpus order, so "occurred before" is "a smaller key with the same hash".
Memory holds one partition: 16 bytes per pair, so `partitions` is chosen from the pair count and
the memory limit by `partitions_for`.
"""

from __future__ import annotations

import os

import dask
import numpy as np

PAIR_BYTES = 16
# a partition is sorted in memory: the pairs, their argsort and the sorted copies
SORT_OVERHEAD = 4


def partitions_for(n_pairs: int, memory_limit: int) -> int:
    """How many hash-prefix partitions keep one partition's sort under `memory_limit` bytes."""
    need = n_pairs * PAIR_BYTES * SORT_OVERHEAD
    return max(1, min(4096, -(-need // max(memory_limit, 1))))


class HashSpill:
    """Append-only (hash, key) files, one per hash prefix, under `folder`."""

    def __init__(self, folder: str, partitions: int, buffer_bytes: int = 8 * 2**20):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.partitions = folder, partitions
        self.paths = [os.path.join(folder, f"{p:05d}.bin") for p in range(partitions)]
        for path in self.paths:
            open(path, "wb").close()
        # pairs are buffered so each flush appends once to each partition, not once per add
        self.buffer_pairs = max(1, buffer_bytes // PAIR_BYTES)
        self.pending: list[np.ndarray] = []
        self.n_pending = 0

    def add(self, hashes: np.ndarray, keys: np.ndarray) -> None:
        pairs = np.empty((len(hashes), 2), dtype=np.uint64)
        pairs[:, 0], pairs[:, 1] = hashes, np.asarray(keys, np.int64)
        self.pending.append(pairs)
        self.n_pending += len(pairs)
        if self.n_pending >= self.buffer_pairs:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        pairs = np.concatenate(self.pending)
        self.pending, self.n_pending = [], 0
        part = (pairs[:, 0] % np.uint64(self.partitions)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        pairs = pairs[order]
        bounds = np.searchsorted(part[order], np.arange(self.partitions + 1))
        for p in range(self.partitions):
            if bounds[p] < bounds[p + 1]:
                with open(self.paths[p], "ab") as f:
                    f.write(pairs[bounds[p] : bounds[p + 1]].tobytes())


def repeated_keys(path: str, keep_first: bool = True) -> np.ndarray:
    """Keys of one partition whose hash occurs more than once: every one but the smallest key
    of each hash (`keep_first`), or all of them."""
    pairs = np.fromfile(path, dtype=np.uint64).reshape(-1, 2)
    if len(pairs) < 2:
        return np.zeros(0, dtype=np.int64)
    hashes, keys = pairs[:, 0], pairs[:, 1].astype(np.int64)
    order = np.lexsort((keys, hashes))
    hashes, keys = hashes[order], keys[order]
    same_as_prev = np.zeros(len(hashes), dtype=bool)
    same_as_prev[1:] = hashes[1:] == hashes[:-1]
    if keep_first:
        return np.sort(keys[same_as_prev])
    same_as_next = np.zeros(len(hashes), dtype=bool)
    same_as_next[:-1] = same_as_prev[1:]
    return np.sort(keys[same_as_prev | same_as_next])


def all_repeated_keys(spill: HashSpill, keep_first: bool = True) -> np.ndarray:
    """Every partition's repeated keys, one partition in memory at a time (a Dask task each, on
    whatever scheduler is active)."""
    spill.flush()
    tasks = [dask.delayed(repeated_keys)(path, keep_first) for path in spill.paths]
    parts = dask.compute(*tasks)
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
