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
        return value if self.size == 1 else self._all_reduce(value, dist.ReduceOp.SUM)

    def maximum(self, value: float) -> float:
        return value if self.size == 1 else self._all_reduce(value, dist.ReduceOp.MAX)

    def _all_reduce(self, value: float, op) -> float:
        # NCCL reduces only CUDA tensors; gloo only CPU ones.
        on_cuda = dist.get_backend(self.group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else None
        t = torch.tensor(value, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op, group=self.group)
        return float(t)

    def mean(self, value: float, weight: float) -> float:
        """The whole batch's mean of a per-rank mean `value` over `weight` items (tokens)."""
        if self.size == 1:
            return value
        return self.total(value * weight) / max(self.total(weight), 1e-30)
