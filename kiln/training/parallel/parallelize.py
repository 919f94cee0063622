"""Apply every parallelism to one model (or pipeline stage), in torchtitan's order.

TP+SP -> EP -> CP -> recompute / activation offload -> compile -> FSDP2 / replicate.
Pipeline splitting happens before this (kiln.training.parallel.pipeline_parallel).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from kiln.training.config import TrainConfig
from kiln.training.parallel.activation_checkpoint import apply_activation_offload, apply_recompute
from kiln.training.parallel.context_parallel import apply_context_parallel
from kiln.training.parallel.data_parallel import apply_fsdp, apply_replicate
from kiln.training.parallel.dims import ParallelDims
from kiln.training.parallel.expert_parallel import apply_expert_parallel, expert_parameters
from kiln.training.parallel.tensor_parallel import apply_tensor_parallel

_PARAM_DTYPE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}


def parallelize(model: nn.Module, dims: ParallelDims, cfg: TrainConfig) -> nn.Module:
    """Turn a plain Transformer (or stage) into its distributed form on `dims`' mesh.

    Without a mesh (one process, no torch.distributed) only recompute, offload and compile apply.
    """
    distributed = dims.world_mesh is not None
    if distributed:
        if dims.tp_enabled:
            apply_tensor_parallel(
                model, dims.mesh("tp"), loss_parallel=use_loss_parallel(dims, cfg)
            )
        if dims.ep_enabled:
            _apply_ep(model, dims)
        if dims.cp_enabled:
            apply_context_parallel(model, dims.mesh("cp"), seq_len=cfg.seq_len)
    apply_recompute(model, cfg.recompute, cfg.selective_recompute)
    if cfg.activation_offload:
        apply_activation_offload(model, layers=cfg.activation_offload_layers)
    if cfg.parallel.compile:
        _apply_compile(model, hooks_outside=cfg.activation_offload)
    if distributed:
        _apply_data_parallel(model, dims, cfg)
    return model


def use_loss_parallel(dims: ParallelDims, cfg: TrainConfig) -> bool:
    """Loss parallelism needs TP; the pipeline's last stage computes the loss on local logits."""
    return dims.tp_enabled and cfg.parallel.loss_parallel and not dims.pp_enabled


def _apply_ep(model: nn.Module, dims: ParallelDims) -> None:
    """Shard experts over the ep ranks (the dp_shard ranks, or dp_shard x cp when ep spans both);
    their gradients are averaged over all data ranks (dp x cp)."""

    ep_mesh = dims.mesh("dp_shard") if dims.ep == dims.dp_shard else dims.mesh("dp_shard_cp")
    apply_expert_parallel(model, ep_mesh, dp_mesh=dims.mesh("dp_cp"))


def _apply_compile(model: nn.Module, hooks_outside: bool = False) -> None:
    """torch.compile each block in place (same graph for every layer: compiles once).
    `hooks_outside`: compile only `forward`, so the block's hooks run eagerly around it. The
    activation-offload hooks keep weak references and a thread-local stack that dynamo cannot
    trace; their saved-tensor hooks still see every tensor the compiled graph saves."""
    for block in model.layers.values():
        if hooks_outside:
            block.forward = torch.compile(block.forward)
        else:
            block.compile()


def _apply_data_parallel(model: nn.Module, dims: ParallelDims, cfg: TrainConfig) -> None:
    """FSDP over dp_shard x cp (with dp_replicate: HSDP), or replicate when nothing is sharded."""
    dtype = _PARAM_DTYPE[cfg.precision]
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    ignored = None
    if dims.ep_enabled:
        ignored = expert_parameters(model)
    if not dims.fsdp_enabled and not cfg.optimizer_offload:
        apply_replicate(model, dims.mesh("dp_replicate"), mp_policy, ignored_params=ignored)
        return
    if dims.dp_replicate_enabled:
        shard_dim = "dp_shard" if not dims.cp_enabled else "dp_shard_cp"
        dp_mesh = dims.mesh(("dp_replicate", shard_dim))  # HSDP: replicate x shard
    else:
        dp_mesh = dims.mesh("dp_shard_cp")
    apply_fsdp(
        model,
        dp_mesh,
        mp_policy,
        reshard_after_forward=cfg.parallel.reshard_after_forward,
        cpu_offload=cfg.optimizer_offload,
        ignored_params=ignored,
    )
