"""Data parallelism with FSDP2: fully_shard (ZeRO-2/3 style), replicate (plain DP), or both."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import Shard

from kiln.model.fused_projections import fused_modules


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    *,
    reshard_after_forward: bool,
    cpu_offload: bool = False,
    ignored_params: set[nn.Parameter] | None = None,
) -> None:
    """fully_shard each block (and multi-token prediction module), then the root (embeddings, final
    norm, output); 2-D dp_mesh = HSDP.

    reshard_after_forward=False keeps parameters gathered from forward to backward: only the
    fp32 master weights, gradients and Adam state stay sharded (Megatron's distributed optimizer).
    True frees them after forward and gathers again in backward (ZeRO-3).
    """
    kwargs = {
        "mesh": dp_mesh,
        "mp_policy": mp_policy,
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        if cpu_offload
        else OffloadPolicy(),
        "ignored_params": ignored_params or None,
    }
    if placement := _fused_placement(model):
        kwargs["shard_placement_fn"] = placement
    for block in [*model.layers.values(), *(model.mtp or ())]:  # MTP modules: a unit each
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    # The root's parameters are used last in forward and first in backward: no point resharding.
    fully_shard(model, reshard_after_forward=False, **kwargs)


def _fused_placement(model: nn.Module):
    """Fused projection weights (`wqkv`, `w13`) shard by columns, all others by rows (None).

    Their state dicts split them by rows into wq/wk/wv and w1/w3 (fused_projections.py): with
    row shards that split would gather each weight and its Adam moments whole on every rank at
    each checkpoint (an 8B model's fused weights: 4.5B numbers); column shards split in place."""
    weights = {id(getattr(m, m.fusion.fused).weight) for m in fused_modules(model).values()}
    if not weights:
        return None
    return lambda param: Shard(1) if id(param) in weights else None


def apply_replicate(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    *,
    ignored_params: set[nn.Parameter] | None = None,
) -> None:
    """Plain data parallelism (FSDP2's replicate): full copies, gradients all-reduced per block."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for block in [*model.layers.values(), *(model.mtp or ())]:
        replicate(block, mesh=dp_mesh, mp_policy=mp_policy, ignored_params=ignored_params or None)
    replicate(model, mesh=dp_mesh, mp_policy=mp_policy, ignored_params=ignored_params or None)
