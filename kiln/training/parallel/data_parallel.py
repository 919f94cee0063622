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
    for block in [*model.layers.values(), *(model.mtp or ())]:  # MTP modules: a unit each
        fully_shard(block, reshard_after_forward=reshard_after_forward, **kwargs)
    # The root's parameters are used last in forward and first in backward: no point resharding.
    fully_shard(model, reshard_after_forward=False, **kwargs)


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
