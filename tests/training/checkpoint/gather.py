"""Gather a trainer's sharded model and optimizer state into plain arrays (test helper)."""

from __future__ import annotations

import numpy as np
import torch

from kiln.training.checkpoint.state import model_state, optimizer_state


def full_state(trainer) -> dict[str, torch.Tensor]:
    """`model.<fqn>` and `optimizer.state.<fqn>.<name>` of this rank's parts as full (unsharded)
    tensors, keyed like the checkpoint. Every rank of a part's mesh must call it (a collective)."""
    out = {}
    for prefix, sd in (
        ("model", model_state(trainer.model_parts)[0]),
        ("optimizer", optimizer_state(trainer.model_parts, trainer.optimizers)[0]),
    ):
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                v = v.full_tensor() if hasattr(v, "full_tensor") else v
                out[f"{prefix}.{k}"] = v.detach().clone()
    return out


def gathered_state(trainer) -> dict[str, np.ndarray]:
    """`full_state` as float32 numpy arrays (picklable across processes)."""
    return {k: v.cpu().float().numpy() for k, v in full_state(trainer).items()}
