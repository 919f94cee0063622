"""Rank function: kiln's Trainer for a few steps under given layouts (fp32, synthetic batches)."""

from __future__ import annotations

import torch

from kiln.training.config import TrainConfig

STEPS = 3  # the 3rd step's loss is the loss after 2 optimizer steps


def train_config(parallel: dict, model: dict, optimizer: dict | None = None) -> TrainConfig:
    return TrainConfig(
        model={"preset": "tiny", "n_layers": 2, **model},
        parallel=parallel,
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        steps=STEPS,
        seed=7,
        device="cpu",
        precision="fp32",
        optimizer={"lr": 3e-3, **(optimizer or {})},
        data={"synthetic": True, "prefetch": 0},
    )


def train_losses(layouts: list[tuple[dict, dict, dict]]) -> list[list[float]]:
    """Per-step losses of one run per (parallel, model, optimizer) layout, one after the other.

    Several layouts share one process group: worker start-up (importing torch's distributed
    stack) costs more than these tiny runs.
    """
    from kiln.training.trainer import Trainer

    results = []
    for parallel, model, optimizer in layouts:
        torch.manual_seed(0)
        history = Trainer(train_config(parallel, model, optimizer)).train()
        results.append([m["loss"] for m in history])
    return results
