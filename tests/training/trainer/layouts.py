"""Shared pieces of the parity tests: one tiny run config and a per-rank runner of many layouts."""

from __future__ import annotations

from typing import Any

STEPS = 3  # the 3rd loss is the loss after 2 optimizer steps (Adam moments, clipping, warmup)


def tiny_config(**overrides: Any):
    """Tiny model, short sequences, 8 sequences per optimizer step, 3 steps, fp32."""
    from kiln.training.config import TrainConfig

    base = {
        "model": "tiny",
        "seq_len": 16,
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "steps": STEPS,
        "seed": 7,
        "optimizer": {"lr": 3e-3, "grad_clip": 1.0},
        "schedule": {"warmup_steps": 1},
        "data": {"synthetic": True, "prefetch": 0},
    }
    parallel = overrides.pop("parallel", {})
    base.update(overrides)
    base["parallel"] = {"dp_shard": -1, **parallel}
    return TrainConfig.model_validate(base)


class RepeatedBatch:
    """The same random batch forever: a model can memorise it, so a falling loss means learning."""

    def __init__(self, micro_batch_size: int, seq_len: int, vocab_size: int):
        import torch

        g = torch.Generator().manual_seed(0)
        sample = torch.randint(0, vocab_size, (micro_batch_size, seq_len + 1), generator=g)
        self.batch = (sample[:, :-1], sample[:, 1:])

    def __iter__(self):
        while True:
            yield self.batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def train_losses(repeat_batch: bool = False, **overrides: Any) -> list[float]:
    """Per-step losses of one run (in this process; distributed if a process group is up)."""
    import torch

    from kiln.training.trainer import Trainer

    torch.set_num_threads(1)  # tiny matmuls: threads only add contention on a shared 2-core box
    cfg = tiny_config(**overrides)
    loader = (
        RepeatedBatch(cfg.micro_batch_size, cfg.seq_len, cfg.model.vocab_size)
        if repeat_batch
        else None
    )
    history = Trainer(cfg, dataloader=loader).train()
    return [m["loss"] for m in history]


def run_layouts(layouts: list[dict[str, Any]]) -> list[list[float]]:
    """On every rank: train each layout in turn (one process group serves them all)."""
    return [train_losses(**layout) for layout in layouts]
