"""AdamW, learning-rate schedules (warmup + cosine, WSD) and global gradient-norm clipping."""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from kiln.training.config import OptimizerConfig, ScheduleConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms); `auto` picks its kernels (fused, or a
    per-parameter loop for DTensor on CPU)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach/fused kernels cannot mix DTensor (FSDP/TP) and plain tensors (EP's local experts)
    # in one group, so each kind gets its own groups.
    groups = []
    for is_dtensor in (True, False):
        kind = [p for p in params if isinstance(p, DTensor) == is_dtensor]
        decay = [p for p in kind if p.ndim >= 2]
        no_decay = [p for p in kind if p.ndim < 2]
        groups += [
            g
            for g in (
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            )
            if g["params"]
        ]
    impl = cfg.implementation
    if impl == "auto" and params and params[0].is_cuda:
        impl = "fused"
    if impl == "auto":
        # On CPU: plain tensors take the fused kernel (one pass over each parameter and its
        # states, no temporaries; bench/optimizer_cpu.py times it against foreach).
        # DTensor groups take a per-parameter loop: DTensor propagates a sharding for each
        # foreach op over its whole parameter list (seconds of CPU per op on a run's first step
        # on a 3-D mesh); a per-parameter op reuses one cached sharding per parameter shape.
        for g in groups:
            plain = not isinstance(g["params"][0], DTensor)
            g["foreach"], g["fused"] = False, plain
        kwargs = {}
    else:
        kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind == "constant":
        return 1.0
    floor = cfg.min_lr_ratio
    if cfg.kind == "cosine":
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    # WSD: warmup, stable at the peak, then a linear decay over the last decay_fraction of steps.
    decay_steps = max(1, round(total_steps * cfg.decay_fraction))
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return 1.0
    return 1.0 - (1 - floor) * min(1.0, (step - decay_start + 1) / decay_steps)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: ScheduleConfig
) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))


def _mesh_key(grad: torch.Tensor):
    if not isinstance(grad, DTensor):
        return None
    mesh = grad.device_mesh
    return (mesh.mesh_dim_names, tuple(mesh.mesh.flatten().tolist()))


@torch.no_grad()
def global_grad_norm(
    params: list[nn.Parameter],
    pp_mesh: DeviceMesh | None = None,
    extra_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """L2 norm of every gradient of the whole model, identical on every rank.

    DTensor gradients (TP, FSDP) are grouped by mesh and reduced over it by DTensor; plain ones
    are local. Pipeline stages hold different layers: their squares are summed over `pp_mesh`.
    `extra_sq` adds norms computed elsewhere (expert-parallel weights, already summed over ep).
    """
    groups: dict = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[_mesh_key(p.grad)].append(p.grad)
    device = next((g.device for gs in groups.values() for g in gs), torch.device("cpu"))
    if isinstance(device, str):
        device = torch.device(device)
    total_sq = torch.zeros((), device=device, dtype=torch.float32)
    for key in sorted(groups, key=str):
        norm = torch.nn.utils.get_total_norm(groups[key], norm_type=2.0, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float().pow(2).to(device)
    if extra_sq is not None:
        total_sq = total_sq + extra_sq.to(device)
    if pp_mesh is not None and pp_mesh.size() > 1:
        dist.all_reduce(total_sq, group=pp_mesh.get_group())
    return total_sq.sqrt()


@torch.no_grad()
def clip_grads_(params: list[nn.Parameter], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale every gradient by min(1, max_norm / total_norm) (the same factor on every rank).

    A scale applies to each rank's shard alike, whatever the placement, so the local tensors are
    scaled: DTensor's sharding propagation of a foreach op with a plain-tensor factor is never
    cached and cost more than the whole backward on a 3-D mesh."""
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    by_device: dict = defaultdict(list)
    for p in params:
        if p.grad is not None:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            by_device[(g.device, g.dtype)].append(g)
    for (device, _), group in by_device.items():
        torch._foreach_mul_(group, coef.to(device))
