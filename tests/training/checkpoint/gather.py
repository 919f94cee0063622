"""Gather a trainer's sharded model and optimizer state into plain arrays (test helper)."""

from __future__ import annotations

import numpy as np
import torch

from kiln.training.checkpoint.state import model_state, optimizer_state


def gathered_state(trainer) -> dict[str, np.ndarray]:
    """`model.<fqn>` and `optimizer.state.<fqn>.<name>` of this rank's parts, full (unsharded) tensors.
    Every rank of a part's mesh must call it (full_tensor is a collective)."""
    out = {}
    for prefix, sd in (
        ("model", model_state(trainer.model_parts)[0]),
        ("optimizer", optimizer_state(trainer.model_parts, trainer.optimizers)[0]),
    ):
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                v = v.full_tensor() if hasattr(v, "full_tensor") else v
                out[f"{prefix}.{k}"] = v.detach().cpu().float().numpy().copy()
    return out
