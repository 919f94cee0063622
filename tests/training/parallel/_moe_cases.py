"""Rank functions for the expert-parallel tests (module level: worker processes import them)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh

from kiln.model.moe import MoE
from kiln.training.parallel.expert_parallel import (
    apply_expert_parallel,
    expert_grad_norm_sq,
    local_expert_ids,
    reduce_expert_grads,
)

# (n_experts, top_k, capacity_factor)
CASES = [(4, 2, None), (4, 1, 1.0), (8, 2, 0.75)]
AUX_COEF = 0.1


def _loss(moe: MoE, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = moe(x)
    return out, (out * w).sum() + AUX_COEF * moe.aux_loss


def expert_grad_pairs(moe: MoE, ref: MoE) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(this rank's expert gradient, the single-process gradient of the same experts) per weight."""
    rows = local_expert_ids(moe)
    return [
        (getattr(moe.experts, n).grad, getattr(ref.experts, n).grad[rows]) for n in ("w13", "w2")
    ]


def ep_vs_single(checkpoint_dir: str) -> list[tuple]:
    """Max |EP - single process| of outputs and gradients; reference loss = mean over ranks.

    The first case's EP model is also saved with DCP to checkpoint_dir (global expert names).
    """
    rank, ep = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",))
    errors = []
    for seed, (n_experts, top_k, capacity) in enumerate(CASES):
        torch.manual_seed(seed)
        ref = MoE(16, 24, n_experts, top_k, capacity)
        x = torch.randn(ep, 3, 10, 16)  # one micro-batch per rank
        w = torch.randn(ep, 3, 10, 16)
        ref_outs, ref_losses = zip(*(_loss(ref, x[r], w[r]) for r in range(ep)), strict=False)
        (sum(ref_losses) / ep).backward()

        moe = apply_expert_parallel(copy.deepcopy(ref), mesh)
        moe.zero_grad()
        out, loss = _loss(moe, x[rank], w[rank])
        loss.backward()
        dist.all_reduce(moe.gate.weight.grad, op=dist.ReduceOp.AVG)  # what FSDP does for the rest

        diffs = [(out - ref_outs[rank]).abs().max().item()]
        diffs.append((moe.gate.weight.grad - ref.gate.weight.grad).abs().max().item())
        ids = local_expert_ids(moe)
        assert ids == list(range(rank * len(ids), (rank + 1) * len(ids)))
        assert len(moe.experts) == len(ids) == n_experts // ep
        diffs += [(g - r).abs().max().item() for g, r in expert_grad_pairs(moe, ref)]
        ref_norm_sq = sum(p.grad.pow(2).sum() for p in ref.experts.parameters())
        diffs.append(abs(expert_grad_norm_sq(moe).item() / ref_norm_sq.item() - 1))  # relative
        names = sorted(moe.state_dict())
        if seed == 0:
            dcp.save(moe.state_dict(), checkpoint_id=checkpoint_dir)
        errors.append(((n_experts, top_k, capacity), max(diffs), names))
    return errors


def ep_with_replicas() -> float:
    """4 ranks as dp_replicate=2 x dp_shard=2 with ep=2 over dp_shard: each expert has 2 copies."""
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    ref = MoE(16, 24, 4, 2)
    x, w = torch.randn(4, 2, 6, 16), torch.randn(4, 2, 6, 16)
    (sum(_loss(ref, x[r], w[r])[1] for r in range(4)) / 4).backward()

    moe = apply_expert_parallel(copy.deepcopy(ref), mesh["dp_shard"])  # dp mesh found from the root
    _, loss = _loss(moe, x[rank], w[rank])
    loss.backward()
    reduce_expert_grads([moe])  # what the trainer's split_for_grad_norm does before clipping
    return max((g - r).abs().max().item() for g, r in expert_grad_pairs(moe, ref))
