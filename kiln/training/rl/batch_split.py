"""A step's batch split over the data-parallel ranks of a laid-out policy (layouts.py), and the
reductions that make the split invisible: each rank scores its contiguous share of the
completions, its loss is weighted so that FSDP2's gradient average equals the whole batch's
gradient, and every reported figure is the whole batch's.

One process (`BatchSplit()`, size 1) changes nothing: no reduction runs and no value is
rescaled, so the on-policy loop stays bit for bit what it was."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class BatchSplit:
    rank: int = 0
    size: int = 1
    group: object = None  # the data-parallel process group

    def bounds(self, n: int) -> tuple[int, int]:
        """This rank's [start, end) of n completions: as even as possible; the whole batch on
        every rank when there are fewer completions than ranks (none may sit a step out)."""
        if self.size == 1 or n < self.size:
            return 0, n
        return n * self.rank // self.size, n * (self.rank + 1) // self.size

    def active(self, n: int) -> bool:
        return self.size > 1 and n >= self.size

    def total(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        if self.size == 1:
            return value
        t = torch.tensor(value, dtype=torch.float64)
        dist.all_reduce(t, group=self.group)
        return float(t)

    def maximum(self, value: float) -> float:
        if self.size == 1:
            return value
        t = torch.tensor(value, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t)

    def mean(self, value: float, weight: float) -> float:
        """The whole batch's mean of a per-rank mean `value` over `weight` items (tokens)."""
        if self.size == 1:
            return value
        return self.total(value * weight) / max(self.total(weight), 1e-30)
