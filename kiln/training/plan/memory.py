"""One rank of a real-size job, built and stepped on fake tensors: its memory, measured.

PyTorch's fake process-group backend stands in for the other ranks (collectives return at once)
and `FakeTensorMode` gives every tensor a shape, dtype and device but no storage, so the trainer's
own `setup()` (mesh, pipeline carving, TP/FSDP/EP sharding, recompute wrappers) and one training
step's forward, backward and optimizer step run as on the real rank, in seconds, for any size.
torch's `MemTracker` counts the bytes each tensor would hold, by kind, at every op.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

from kiln.training.metrics import flops_per_token
from kiln.training.parallel.context_parallel import shard_for_context_parallel
from kiln.training.parallel.expert_parallel import register_expert_grad_hooks
from kiln.training.parallel.loss import cross_entropy_loss, loss_parallel_context
from kiln.training.parallel.meta_init import _allocate
from kiln.training.parallel.pipeline_parallel import pipeline_microbatches
from kiln.training.plan.moe import planned_routing
from kiln.training.precision import autocast_context
from kiln.training.trainer import Trainer

if TYPE_CHECKING:
    from kiln.training.config import TrainConfig

_KINDS = {
    "params": _MemRefType.PARAM,
    "buffers": _MemRefType.BUFFER,
    "grads": _MemRefType.GRAD,
    "optimizer": _MemRefType.OPT,
}


class FakeRankTrainer(Trainer):
    """The trainer of one rank with its local shards allocated as fake tensors (no storage)."""

    def __init__(self, cfg: TrainConfig, fake_mode):
        super().__init__(cfg, dataloader=[])
        self.fake_mode = fake_mode

    def _materialize(self, materialize, init_device: torch.device) -> None:
        """`to_empty` under fake mode: values do not matter here, only shapes and dtypes."""

        with self.fake_mode:
            for part in self.model_parts:
                _allocate(part, self.cfg.model, init_device)
                part.init_buffers(self.device)
                register_expert_grad_hooks(part)


@dataclass
class StepMemory:
    """Bytes of one rank: steady state (after the optimizer step) and the step's peak."""

    params: int
    buffers: int
    grads: int
    optimizer: int
    activations: int  # saved for backward by one micro-batch, all local stages
    in_flight: int  # pipeline micro-batches whose activations are alive at once (1 without pp)
    peak: int

    def gib(self) -> dict[str, float]:
        return {k: round(v / 2**30, 3) for k, v in vars(self).items() if k != "in_flight"}


def _device_bytes(tracker: MemTracker, which: str) -> dict[_MemRefType, int]:
    snap = tracker.get_tracker_snapshot(which)
    merged: dict[_MemRefType, int] = {}
    for per_device in snap.values():
        for kind, value in per_device.items():
            if isinstance(kind, _MemRefType):
                merged[kind] = merged.get(kind, 0) + value
    return merged


def _total(tracker: MemTracker, which: str = "current") -> int:
    return sum(_device_bytes(tracker, which).values())


def micro_batch(trainer: Trainer, first_stage: bool) -> torch.Tensor:
    """This rank's input to one (pipeline) micro-batch: tokens, or a later stage's hidden states."""
    cfg, dims = trainer.cfg, trainer.dims
    batch = cfg.micro_batch_size
    if dims.pp_enabled:
        batch //= pipeline_microbatches(cfg)
    seq = cfg.seq_len // dims.cp
    if first_stage:
        return torch.randint(0, cfg.model.vocab_size, (batch, seq), device=trainer.device)
    if dims.tp_enabled:  # sequence parallel: stages pass sequence-sharded hidden states
        seq //= dims.tp
    dtype = torch.float32 if cfg.precision == "fp32" else torch.bfloat16
    return torch.randn(batch, seq, cfg.model.dim, device=trainer.device, dtype=dtype)


def _forward_backward(trainer: Trainer, tracker: MemTracker, grad_scale: float) -> list[int]:
    """One micro-batch through every local part; the bytes each part saved for backward."""

    cfg, saved, dev = trainer.cfg, [], trainer.device
    n_parts = len(trainer.model_parts)
    for i, part in enumerate(trainer.model_parts):
        first = part.tok_embeddings is not None
        last = part.output is not None
        with ExitStack() as stack:
            stack.enter_context(autocast_context(cfg.precision, trainer.device.type, True))
            stack.enter_context(loss_parallel_context(trainer.loss_parallel and last))
            inputs = micro_batch(trainer, first)
            tracker.reset_mod_stats()  # per-module stats only: one call per module allowed
            before = _total(tracker)
            # multi-token prediction (pp = tp = cp = 1: one part) runs its modules on the labels
            mtp = {"mtp_labels": inputs.roll(-1, 1)} if cfg.model.mtp_depth else {}
            if last and cfg.loss_chunk_tokens:  # pp = 1: one part, the head fused in
                labels = torch.randint(0, cfg.model.vocab_size, inputs.shape[:2], device=dev)
                chunk = {"labels": labels, "loss_chunk_tokens": cfg.loss_chunk_tokens}
                out = _stage_forward(trainer, part, inputs, **chunk, **mtp) * grad_scale
            else:
                out = _stage_forward(trainer, part, inputs, **mtp)
            if last and not cfg.loss_chunk_tokens:
                labels = torch.randint(0, cfg.model.vocab_size, out.shape[:2], device=out.device)
                out = cross_entropy_loss(out, labels) * grad_scale
            if mtp:
                out = out + cfg.model.mtp_loss_weight * grad_scale * part.mtp_loss
            saved.append(_total(tracker) - before)
            if last:
                out.backward()
            else:
                out.backward(torch.ones_like(out))
        del out, inputs
        assert len(saved) == i + 1 <= n_parts
    return saved


def _stage_forward(
    trainer: Trainer, part: nn.Module, inputs: torch.Tensor, **kwargs
) -> torch.Tensor:
    if trainer.dims.cp_enabled and part.tok_embeddings is not None:
        full = torch.cat([inputs] * trainer.dims.cp, dim=1)  # shard a full-length batch
        inputs, _ = shard_for_context_parallel(full, full, trainer.dims.mesh("cp"))
    return part(inputs, **kwargs)


def in_flight_activations(trainer: Trainer, saved: list[int]) -> tuple[int, int]:
    """The most activation bytes alive at once under this rank's pipeline schedule, and how many
    micro-batches' worth that is (walks the schedule's own action list: a forward holds its
    stage's activations until its backward, or its weight-gradient step under zero bubble)."""
    if not trainer.dims.pp_enabled:
        return sum(saved), 1
    schedule = trainer.schedule
    rank = trainer.dims.mesh("pp").get_local_rank()
    actions = [a for a in schedule.pipeline_order[rank] if a is not None]
    kinds = {a.computation_type.value for a in actions}
    release = "W" if "W" in kinds else "B"
    by_stage = {
        s.stage_index: saved[i] for i, s in enumerate(_schedule_stages(schedule, len(saved)))
    }
    live = peak = count = peak_count = 0
    for a in actions:
        kind = a.computation_type.value
        if kind == "F":
            live, count = live + by_stage[a.stage_index], count + 1
        elif kind == release:
            live, count = live - by_stage[a.stage_index], count - 1
        if live > peak:
            peak, peak_count = live, count
    return peak, peak_count


def _schedule_stages(schedule, n: int) -> list:
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    assert len(stages) == n, (len(stages), n)
    return stages


def measure_step(trainer: Trainer) -> StepMemory:
    """One optimizer step's memory with up to two accumulation micro-batches (the second has
    gradients alive). Later steps hold the optimizer state during forward and backward too."""
    tracker = MemTracker()
    tracker.track_external(*trainer.model_parts, *trainer.optimizers)
    accum = min(trainer.grad_accum, 2)
    with tracker:
        for opt in trainer.optimizers:
            opt.zero_grad(set_to_none=True)
        for micro in range(accum):
            trainer._set_grad_sync(micro == accum - 1)
            saved = _forward_backward(trainer, tracker, 1.0 / accum)
        backward_peak = _total(tracker, "peak")
        for opt in trainer.optimizers:
            opt.step()
        steady = _device_bytes(tracker, "current")
    # The step's own peak is modelled, not read: fake mode over-counts the first step's state
    # initialisation on DTensors (6x the parameters' bytes where a real step holds 3x) and
    # counts no temporaries in later steps.
    step_peak = sum(steady.values()) + sum(_optimizer_temporaries(o) for o in trainer.optimizers)
    figures = {name: steady.get(kind, 0) for name, kind in _KINDS.items()}
    activations, in_flight = in_flight_activations(trainer, saved)
    # the tracker saw one stage's micro-batch alive at a time; the schedule keeps more
    backward_peak += figures["optimizer"] + activations - max(saved)
    peak = max(backward_peak, step_peak)
    return StepMemory(**figures, activations=activations, in_flight=in_flight, peak=peak)


def _optimizer_temporaries(opt: torch.optim.Optimizer) -> int:
    """Bytes AdamW allocates inside one step: foreach holds sqrt(exp_avg_sq) for every parameter
    at once, the per-parameter loop one parameter's worth, the fused kernel nothing."""
    sizes = [
        _local(p).numel() * _local(p).element_size()
        for group in opt.param_groups
        for p in group["params"]
    ]
    if not sizes or opt.defaults.get("fused"):
        return 0
    return sum(sizes) if opt.defaults.get("foreach") else max(sizes)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _clear_caches() -> None:
    """Cached fake-op and DTensor sharding results hold the previous plan's meshes, whose process
    groups are gone once a new fake world starts."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._redistribute import (
        _gen_transform_infos,
        clear_redistribute_planner_cache,
    )

    FakeTensorMode.cache_clear()
    torch._C._clear_DTensor_sharding_propagator_cache()
    clear_redistribute_planner_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _gen_transform_infos.cache_clear()


def plan_rank(cfg: TrainConfig, rank: int, world: int) -> dict[str, Any]:
    """Set up rank `rank` of `world` on the fake backend and fake tensors, run one step's shapes;
    its local parameters, batch figures and memory (GiB)."""
    info, memory = plan_step(cfg, rank, world)
    return {
        **info,
        "in_flight": memory.in_flight,
        **{f"{k}_gib": v for k, v in memory.gib().items()},
    }


def plan_step(cfg: TrainConfig, rank: int, world: int) -> tuple[dict[str, Any], StepMemory]:
    """plan_rank's figures without the memory, and the memory in bytes."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _clear_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        trainer = FakeRankTrainer(cfg, fake_mode).setup()
        with fake_mode, planned_routing():  # MoE: balanced routing, capacity-bound owners
            memory = measure_step(trainer)
        local = sum(_local(p).numel() for part in trainer.model_parts for p in part.parameters())
        tokens = cfg.global_batch_size * cfg.seq_len
        info = {
            "rank": rank,
            "world": world,
            "local_params": local,
            "grad_accum": trainer.grad_accum,
            "model_parts": len(trainer.model_parts),
            "tokens_per_step": tokens,
            "tflops_per_step_per_rank": round(
                flops_per_token(cfg.model, cfg.seq_len) * tokens / world / 1e12, 1
            ),
        }
        return info, memory
    finally:
        dist.destroy_process_group()
