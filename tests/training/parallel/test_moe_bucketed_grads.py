"""Expert gradients over replicas: one flattened all-reduce per step, same values as the
single-process run, with gradient accumulation over two micro-batches."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from kiln.model.moe import MoE
from kiln.training.parallel.expert_parallel import (
    apply_expert_parallel,
    split_for_grad_norm,
)
from tests.training.distributed import run_distributed
from tests.training.parallel._moe_cases import expert_grad_pairs


def accumulate_with_replicas() -> tuple[float, int]:
    """dp_replicate=2 x dp_shard=2, ep=2 over dp_shard, 2 micro-batches per rank; returns the
    max |EP - single process| expert gradient and the number of all-reduces backward + the
    step's reduction issued."""
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    ref = MoE(16, 24, 4, 2)
    x, w = torch.randn(4, 2, 2, 6, 16), torch.randn(4, 2, 2, 6, 16)  # [rank, micro, B, S, D]
    ref_loss = sum((ref(x[r, m]) * w[r, m]).sum() for r in range(4) for m in range(2))
    (ref_loss / 4).backward()  # FSDP averages over the 4 data ranks, sums over micro-batches

    moe = apply_expert_parallel(copy.deepcopy(ref), mesh["dp_shard"])
    calls = 0
    original = dist.all_reduce

    def counting_all_reduce(*args, **kwargs):
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        for m in range(2):
            (moe(x[rank, m]) * w[rank, m]).sum().backward()
        n_before_norm = calls
        split_for_grad_norm([moe])  # the trainer's step: replica reduction, then the ep norm
        n_reduce = calls - n_before_norm - 1  # minus the norm's own all-reduce over ep
    finally:
        dist.all_reduce = original
    err = max((g - r).abs().max().item() for g, r in expert_grad_pairs(moe, ref))
    return err, n_before_norm + n_reduce


@pytest.mark.slow
def test_expert_grads_reduced_in_one_bucket_per_step():
    for err, all_reduces in run_distributed(accumulate_with_replicas, 4):
        assert err < 1e-5
        assert all_reduces == 1  # was one per expert weight per micro-batch (6 x 2 here)
