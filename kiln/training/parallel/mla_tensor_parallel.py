"""Tensor parallelism for Multi-head Latent Attention: heads split, latents replicated.

The projections that produce per-head numbers split column-wise by heads (`wq` or `wq_b`,
`wkv_b`), `wo` row-wise back to sequence shards. The low-rank parts (`wq_a`, `q_norm`, `wkv_a`,
`kv_norm`) are small and shared by every head: each TP rank holds them whole and computes them
on the gathered sequence. Their gradients must be the full ones on every rank: what flows back
through a column-wise projection is summed over the ranks by DTensor, and the one RoPE key all
heads share is summed at `shared_key` (identity forward, all-reduce backward, Megatron's
copy-to-tensor-parallel region), since each rank's attention uses it for its own heads only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
)


def mla_attention_plan(attention: nn.Module) -> dict:
    """The block-relative TP plan of an MLA `attention` (a plain, replicated input inside)."""
    plan = {
        # the gathered sequence as a plain tensor: the replicated low-rank layers take it as is
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=True,
        ),
        "attention.wkv_b": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }
    plan["attention.wq" if attention.wq is not None else "attention.wq_b"] = ColwiseParallel()
    return plan


def sum_shared_key_grads(attention: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Sum the shared RoPE key's gradient over the TP ranks (each used it for its own heads)."""

    def hook(_module: nn.Module, _args: tuple, key: torch.Tensor) -> torch.Tensor:
        replicated = DTensor.from_local(key, tp_mesh, [Replicate()], run_check=False)
        return replicated.to_local(grad_placements=[Partial()])

    attention.shared_key.register_forward_hook(hook)
