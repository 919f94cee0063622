"""What a checkpoint holds, as one DCP state dict built from the trainer's live objects.

Layout (DCP flattens nested dicts into dotted keys):
    model.<global fqn>                  params of every local model part (DTensor shards)
    optimizer.state.<fqn>.<name>        optimizer state, flattened per parameter so it reshards
    optimizer.param_groups.<fqn>.<opt>  across any PP split (torchtitan's trick)
    lr_scheduler.*                      the first scheduler (all parts share one schedule)
    train.step, train.tokens_seen
    dataloader.dp<r>                    each data-parallel rank's loader position (pickled)
    rng.rank<r>                         each rank's RNG states (pickled)

Model and optimizer keys use global parameter names, so a checkpoint written under one
(pp, dp_replicate, dp_shard, cp, tp) layout loads into any other, and into one process.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def world_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def data_parallel_coords(trainer) -> tuple[int, int]:
    """(dp rank, dp size) over the dp_replicate x dp_shard mesh dims; TP/CP/PP peers share one."""
    if isinstance(getattr(trainer, "dp_size", None), int):
        return trainer.dp_rank, trainer.dp_size
    mesh = getattr(trainer, "mesh", None)
    if mesh is None or not dist.is_initialized():
        return 0, 1
    names = list(mesh.mesh_dim_names or ())
    coord = mesh.get_coordinate() or [0] * len(names)
    rank, size = 0, 1
    for dim in ("dp_replicate", "dp_shard"):
        if dim in names:
            i = names.index(dim)
            n = mesh.size(i)
            rank, size = rank * n + coord[i], size * n
    return rank, size


def model_state(parts: list[torch.nn.Module]) -> tuple[dict[str, Any], list[list[str]]]:
    """Merged model state of all local parts, and each part's keys (to split it again)."""
    merged: dict[str, Any] = {}
    keys = []
    for part in parts:
        sd = get_model_state_dict(part)
        keys.append(list(sd))
        merged.update(sd)
    return merged, keys


def optimizer_state(parts, optimizers) -> tuple[dict[str, Any], list[list[str]]]:
    merged: dict[str, Any] = {}
    keys = []
    for part, opt in zip(parts, optimizers, strict=True):
        sd = get_optimizer_state_dict(part, opt, options=_OPTIM_OPTIONS)
        keys.append(list(sd))
        merged.update(sd)
    return merged, keys


def apply_model_state(parts, state: dict[str, Any], keys: list[list[str]]) -> None:
    for part, part_keys in zip(parts, keys, strict=True):
        set_model_state_dict(part, {k: state[k] for k in part_keys})


def apply_optimizer_state(parts, optimizers, state: dict[str, Any], keys: list[list[str]]) -> None:
    for part, opt, part_keys in zip(parts, optimizers, keys, strict=True):
        set_optimizer_state_dict(
            part, opt, {k: state[k] for k in part_keys}, options=_OPTIM_OPTIONS
        )


def rng_state() -> bytes:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    return pickle.dumps(state)


def set_rng_state(blob: bytes) -> None:
    state = pickle.loads(blob)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def dataloader_state(trainer) -> bytes | None:
    loader = getattr(trainer, "dataloader", None)
    if loader is None or not hasattr(loader, "state_dict"):
        return None
    return pickle.dumps(loader.state_dict())
