"""Aux-loss-free load balancing (DeepSeek-V3): after each optimizer step, every sigmoid router's
selection bias moves by `rate * sign(mean load - load)`, the load being the assignments each
expert received during the step, summed over every rank that saw different tokens (data and
context ranks), so each rank applies the same update a single process would.

A full recompute repeats a block's forward and counts its assignments twice, uniformly across
experts: the sign, and so the update, does not change.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from kiln.model.router import SigmoidGroupedRouter


@torch.no_grad()
def update_router_biases(
    model_parts: list[nn.Module], rate: float, group: dist.ProcessGroup | None = None
) -> None:
    """Apply one bias update to every sigmoid router in `model_parts` (collective over `group`
    when given: every rank of it must call this)."""
    routers = [
        m for part in model_parts for m in part.modules() if isinstance(m, SigmoidGroupedRouter)
    ]
    if not routers:
        return
    loads = torch.stack([r.take_load().float() for r in routers])  # [routers, experts]
    if rate == 0:
        return
    if group is not None:
        dist.all_reduce(loads, group=group)
    for router, load in zip(routers, loads, strict=True):
        step = rate * torch.sign(load.mean() - load)
        router.e_score_correction_bias.add_(step.to(router.e_score_correction_bias))
