"""Blending several GPT datasets by weight.

Like Megatron's `BlendedDataset`, sample i of the blend comes from the dataset whose share so far
lags its weight the most. Here that greedy interleave is computed without a loop: dataset d's
k-th sample is due at time (k + 0.5) / w_d, and the blend is all due times merged in order
(ties to the lower dataset index) — every prefix of the blend then holds each dataset within one
sample of its weighted share.
"""

from __future__ import annotations

import numpy as np

from kiln.training.data.gpt_dataset import GPTDataset


def build_blending_indices(
    weights: np.ndarray, size: int, limits: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(dataset index, sample index within that dataset) for each of `size` blended samples."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    due, which, local = [], [], []
    for d, (w, limit) in enumerate(zip(weights, limits, strict=False)):
        k = np.arange(min(limit, int(np.ceil(w * size)) + 1), dtype=np.int64)
        due.append((k + 0.5) / w)
        which.append(np.full(len(k), d, dtype=np.int16))
        local.append(k)
    due_all, which_all, local_all = (
        np.concatenate(due),
        np.concatenate(which),
        np.concatenate(local),
    )
    order = np.lexsort((which_all, due_all))[:size]
    return which_all[order], local_all[order]


class BlendedDataset:
    """Samples drawn from several `GPTDataset`s in proportion to `weights`."""

    def __init__(
        self, datasets: list[GPTDataset], weights: list[float], size: int | None = None
    ) -> None:
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        w = np.asarray(weights, dtype=np.float64)
        if (w <= 0).any():
            raise ValueError(f"blend weights must be positive (got {weights})")
        w = w / w.sum()
        self.datasets = datasets
        self.weights = w
        self.seq_len = datasets[0].seq_len
        # By default: as many samples as fit without repeating any dataset within one pass.
        self.size = size or int(min(len(ds) / wi for ds, wi in zip(datasets, w, strict=False)))
        self.dataset_index, self.dataset_sample_index = build_blending_indices(
            w, self.size, [len(ds) for ds in datasets]
        )

    def __len__(self) -> int:
        return self.size

    def gather(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        which = self.dataset_index[ids]
        local = self.dataset_sample_index[ids]
        out = np.empty((len(ids), self.seq_len + 1), dtype=np.int64)
        for d in np.unique(which):
            mask = which == d
            out[mask] = self.datasets[d].gather(local[mask])
        return out

    def gather_range(self, first: int, count: int) -> np.ndarray:
        return self.gather(np.arange(first, first + count))
