"""Pipeline parallelism with torch.distributed.pipelining: split, build stages, pick a schedule.

Stages are contiguous runs of layers balanced by parameter count (embeddings count towards the
first stage, norm + output towards the last) and keep global layer names (`layers.7`), so
checkpoints reshard across different splits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from kiln.model.config import ModelConfig
from kiln.platform.errors import ConfigError
from kiln.training.parallel.pipeline_shape import pipeline_microbatches, virtual_stages


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def split_layers(
    layer_sizes: list[int], first_extra: int, last_extra: int, n_stages: int
) -> list[list[int]]:
    """Contiguous layer ranges, one per stage, minimising the largest stage's parameter count."""
    n = len(layer_sizes)
    if n < n_stages:
        raise ConfigError(
            f"model.n_layers ({n}) must be >= the number of pipeline stages ({n_stages})"
        )
    prefix = [0]
    for size in layer_sizes:
        prefix.append(prefix[-1] + size)

    def cost(stage: int, lo: int, hi: int) -> int:
        extra = (first_extra if stage == 0 else 0) + (last_extra if stage == n_stages - 1 else 0)
        return prefix[hi] - prefix[lo] + extra

    # best[s][i]: minimal max-cost placing layers[:i] on stages[:s]; classic linear partition DP.
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for s in range(1, n_stages + 1):
        for i in range(s, n - (n_stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], cost(s - 1, j, i))
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    bounds, i = [], n
    for s in range(n_stages, 0, -1):
        bounds.append((cut[s][i], i))
        i = cut[s][i]
    return [list(range(lo, hi)) for lo, hi in reversed(bounds)]


def stage_ids(pp_rank: int, pp: int, virtual: int, schedule: str) -> list[int]:
    """Which stages this rank runs: looped (interleaved) or V-shaped (zbv)."""
    if schedule == "zbv":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + v * pp for v in range(virtual)]


def carve_stage(model: nn.Module, layer_ids: list[int], is_first: bool, is_last: bool) -> nn.Module:
    """A copy of the model holding only its stage's layers (global names kept); free on meta."""
    stage = copy.deepcopy(model)
    keep = {str(i) for i in layer_ids}
    for key in list(stage.layers.keys()):
        if key not in keep:
            del stage.layers[key]
    if not is_first:
        stage.tok_embeddings = None
    if not is_last:
        stage.norm, stage.output = None, None
    return stage


class _NotAView(torch.autograd.Function):
    """Identity whose output is a new tensor, not a view (same storage: no copy)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _fresh_output(module: nn.Module, args, output):
    """A stage's output as FSDP should see it: not a view. Under TP the last stage's logits are
    `DTensor.to_local()`'s view (the output layer's ColwiseParallel, no loss parallelism under
    pp); FSDP registers its pre-backward hook on the stage output, and an in-place op on a
    view would silently drop that hook (torch warns "returned a view tensor"). The schedule's
    loss does no in-place op, so gradients were right (tests/training/parallel/
    test_pipeline_grads.py); this keeps them right whatever consumes the output, with no copy."""
    if isinstance(output, torch.Tensor) and output.requires_grad and output._base is not None:
        return _NotAView.apply(output)
    return output


def build_pipeline(
    model: nn.Module,
    pp_mesh: DeviceMesh,
    cfg,
    device: torch.device,
    loss_fn: Callable,
    parallelize_fn: Callable[[nn.Module], nn.Module],
    accumulation: int = 1,
):
    """Split `model` (on `device`, or on meta to be materialised later), parallelize each local
    stage, wrap them in a schedule.

    `accumulation`: gradient-accumulation micro-batches fed through one `schedule.step` (their
    batches concatenated), so the schedule reduces gradients once per optimizer step rather
    than once per accumulation micro-batch. `loss_fn` must divide by the number of schedule
    micro-batches (`pipeline_microbatches(cfg) * accumulation`).
    Returns (schedule, model_parts, has_first_stage, has_last_stage).
    """
    p = cfg.parallel
    pp, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    virtual = virtual_stages(p)
    n_stages = pp * virtual
    mcfg: ModelConfig = model.cfg
    sizes = [_numel(model.layers[str(i)]) for i in range(mcfg.n_layers)]
    layout = split_layers(
        sizes, _numel(model.tok_embeddings), _numel(model.norm) + _numel(model.output), n_stages
    )
    n_micro = pipeline_microbatches(cfg)
    if cfg.micro_batch_size % n_micro:
        raise ConfigError(
            f"micro_batch_size ({cfg.micro_batch_size}) must be a multiple of "
            f"pp_microbatches ({n_micro})"
        )
    stages, parts = [], []
    ids = stage_ids(rank, pp, virtual, p.pp_schedule)
    for sid in ids:
        part = parallelize_fn(carve_stage(model, layout[sid], sid == 0, sid == n_stages - 1))
        # before FSDP's post-forward hook (registered by parallelize_fn's fully_shard/replicate)
        part.register_forward_hook(_fresh_output, prepend=True)
        parts.append(part)
        stages.append(PipelineStage(part, sid, n_stages, device, group=pp_mesh.get_group()))
    schedule = _schedule(p.pp_schedule, stages, n_micro * accumulation, loss_fn)
    return schedule, parts, 0 in ids, (n_stages - 1) in ids


def _schedule(kind: str, stages: list[PipelineStage], n_micro: int, loss_fn: Callable):
    # scale_grads would divide *all* accumulated gradients after every step, which breaks gradient
    # accumulation over several steps; the trainer folds 1/n_microbatches into the loss instead.
    kwargs = {"loss_fn": loss_fn, "scale_grads": False}
    if kind == "gpipe":
        return ScheduleGPipe(stages[0], n_micro, **kwargs)
    if kind == "1f1b":
        return Schedule1F1B(stages[0], n_micro, **kwargs)
    if kind == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, n_micro, **kwargs)
    return ScheduleZBVZeroBubble(stages, n_micro, **kwargs)
