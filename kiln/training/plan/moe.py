"""MoE under `kiln plan`: routing replaced by its planned shape, so fake tensors can follow it.

A real MoE layer reads the per-expert row counts to the host (the capacity's kept rows, the
loop's split sizes, expert parallelism's all-to-all splits). Fake tensors have no values, so the
planner routes as a balanced router would: every expert gets tokens*top_k/n_experts rows of
this rank's micro-batch (capped at the capacity). Under expert parallelism an owner receives
from every rank of its ep group; with `capacity_factor` set it is planned at the capacity
(the most a source may send to one expert, so the worst case an owner can see), without one
at the balanced share (no bound exists: routing may send everything to one rank).

Counts are real host tensors (fake mode accepts them as inputs), so `.tolist()` works; the
expert-parallel dispatch uses the planned splits instead of exchanging counts (the fake backend
moves no data).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from kiln.model.moe import MoE
from kiln.training.parallel.expert_parallel import ExpertParallelMoE, _AllToAll


def planned_counts(n_tokens: int, top_k: int, n_experts: int, capacity_factor: float | None):
    """(rows each expert takes from this rank, rows an owner receives per expert and source)."""
    per_expert = n_tokens * top_k // n_experts
    if capacity_factor is None:
        return per_expert, per_expert
    capacity = math.ceil(capacity_factor * n_tokens * top_k / n_experts)
    return min(per_expert, capacity), capacity


def _host_long(n: int, value: int) -> torch.Tensor:
    """A real (not fake) host tensor, so `.tolist()` on it works inside fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return torch.full((n,), value, dtype=torch.long)


def _assign(self: MoE, top_idx: torch.Tensor, top_w: torch.Tensor):
    n_tokens, k = top_idx.shape
    sent, received = planned_counts(n_tokens, k, self.n_experts, self.capacity_factor)
    self._planned = sent, received
    kept = sent * self.n_experts
    # Shapes only: which tokens and weights does not change any tensor's size.
    token = torch.arange(n_tokens, device=top_idx.device).repeat(k)[:kept]
    weight = top_w.t().reshape(-1)[:kept]
    return token, weight, _host_long(self.n_experts, sent)


def _run_experts_ep(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """ExpertParallelMoE.run_experts with the planned splits (no count exchange): the same
    all-to-alls, regrouping copies and expert GEMMs, on the planned number of rows."""

    ep = dist.get_world_size(self.ep_group)
    n_local = self.n_experts // ep
    sent, received = self._planned
    send_splits, recv_splits = [sent * n_local] * ep, [received * n_local] * ep
    rows = _AllToAll.apply(x, recv_splits, send_splits, self.ep_group)
    order = torch.arange(sum(recv_splits), device=x.device)
    per_expert = _host_long(n_local, received * ep)
    y = self.experts(rows[order], per_expert).to(x.dtype)
    y = torch.empty_like(y).index_copy(0, order, y)
    return _AllToAll.apply(y, send_splits, recv_splits, self.ep_group)


class _PlannedGroupedMM(torch.autograd.Function):
    """torch._grouped_mm's shapes and saved tensors (its meta kernel takes bf16 only, while the
    CPU kernel kiln uses also runs fp32)."""

    @staticmethod
    def forward(ctx, x, w, offs):
        ctx.save_for_backward(x, w)
        return x.new_empty(x.shape[0], w.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(w), None


def _grouped_mm(x, w, offs=None, **_):
    return _PlannedGroupedMM.apply(x, w, offs)


@contextmanager
def planned_routing() -> Iterator[None]:
    """Route every MoE layer as planned (see the module docstring) inside the block."""

    patches = [
        (MoE, "assign", _assign),
        (ExpertParallelMoE, "run_experts", _run_experts_ep),
        (torch, "_grouped_mm", _grouped_mm),
    ]
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
