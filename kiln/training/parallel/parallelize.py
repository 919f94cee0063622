"""Apply every parallelism to one model (or pipeline stage), in torchtitan's order.

TP+SP -> EP -> CP -> recompute / activation offload -> compile -> FSDP2 / replicate.
Pipeline splitting happens before this (kiln.training.parallel.pipeline_parallel).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.parallel.activation_checkpoint import apply_activation_offload, apply_recompute
from kiln.training.parallel.data_parallel import apply_fsdp, apply_replicate
from kiln.training.parallel.mesh import submesh
from kiln.training.parallel.tensor_parallel import apply_tensor_parallel

_PARAM_DTYPE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}


def parallelize(model: nn.Module, world_mesh: DeviceMesh | None, cfg: TrainConfig) -> nn.Module:
    """Turn a plain Transformer (or stage) into its distributed form for `world_mesh` (None: 1 process)."""
    p = cfg.parallel
    if world_mesh is not None:
        p = p.resolved(world_mesh.size())
        if p.tp > 1:
            apply_tensor_parallel(model, world_mesh["tp"], loss_parallel=use_loss_parallel(cfg))
        if p.ep > 1:
            _apply_ep(model, world_mesh, p)
        if p.cp > 1:
            from kiln.training.parallel.context_parallel import apply_context_parallel

            apply_context_parallel(model, world_mesh["cp"], seq_len=cfg.seq_len)
    apply_recompute(model, cfg.recompute, cfg.selective_recompute)
    if cfg.activation_offload:
        apply_activation_offload(model)
    if p.compile:
        _apply_compile(model)
    if world_mesh is not None:
        _apply_data_parallel(model, world_mesh, cfg, p)
    return model


def use_loss_parallel(cfg: TrainConfig) -> bool:
    """Loss parallelism needs TP; the pipeline's last stage computes the loss on local logits."""
    return cfg.parallel.tp > 1 and cfg.parallel.loss_parallel and cfg.parallel.pp == 1


def _ep_mesh(world_mesh: DeviceMesh, p) -> DeviceMesh:
    """EP borrows the dp_shard ranks (or dp_shard x cp when ep spans both)."""
    if p.ep == p.dp_shard:
        return world_mesh["dp_shard"]
    if p.ep == p.dp_shard * p.cp:
        return submesh(world_mesh, "dp_shard_cp")
    raise ConfigError(
        f"parallel.ep={p.ep} must equal dp_shard ({p.dp_shard}) or dp_shard*cp ({p.dp_shard * p.cp})"
    )


def _apply_ep(model: nn.Module, world_mesh: DeviceMesh, p) -> None:
    """Shard experts over the ep ranks; their gradients are averaged over all data ranks (dp x cp)."""
    from kiln.training.parallel.expert_parallel import apply_expert_parallel

    apply_expert_parallel(model, _ep_mesh(world_mesh, p), dp_mesh=submesh(world_mesh, "dp_cp"))


def _apply_compile(model: nn.Module) -> None:
    """torch.compile each block in place (same graph for every layer: compiles once)."""
    for block in model.layers.values():
        block.compile()


def _apply_data_parallel(model: nn.Module, world_mesh: DeviceMesh, cfg: TrainConfig, p) -> None:
    """FSDP over dp_shard x cp (with dp_replicate: HSDP), or replicate when nothing is sharded."""
    dtype = _PARAM_DTYPE[cfg.precision]
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    ignored = None
    if p.ep > 1:
        from kiln.training.parallel.expert_parallel import expert_parameters

        ignored = expert_parameters(model)
    if p.dp_shard * p.cp == 1 and not cfg.optimizer_offload:
        apply_replicate(model, world_mesh["dp_replicate"], mp_policy, ignored_params=ignored)
        return
    if p.dp_replicate > 1:
        shard_dim = "dp_shard" if p.cp == 1 else "dp_shard_cp"
        dp_mesh = world_mesh["dp_replicate", shard_dim]  # HSDP: replicate x shard
    else:
        dp_mesh = submesh(world_mesh, "dp_shard_cp")
    apply_fsdp(
        model,
        dp_mesh,
        mp_policy,
        reshard_after_forward=p.reshard_after_forward,
        cpu_offload=cfg.optimizer_offload,
        ignored_params=ignored,
    )
