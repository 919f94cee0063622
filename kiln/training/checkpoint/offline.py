"""Read a checkpoint in one process, without torch.distributed (export and inspection use this)."""

from __future__ import annotations

from typing import Any

import torch

from kiln.platform.errors import InputError
from kiln.training.checkpoint import storage


def resolve(path: str) -> str:
    """A checkpoint folder, or a root whose `latest` pointer names one."""
    path = path.rstrip("/")
    if storage.is_complete(path):
        return path
    latest = storage.latest_checkpoint(path)
    if latest is None:
        raise InputError(
            f"{path}: no complete checkpoint here "
            "(expected .metadata + kiln.json, or a `latest` pointer)"
        )
    return latest


def read_sidecar(path: str) -> dict[str, Any]:
    return storage.read_json(storage.join(resolve(path), storage.SIDECAR))


def load_state(path: str, prefix: str | None = None) -> dict[str, Any]:
    """Full (unsharded) tensors of every key under `prefix` ("model", "optimizer", ...) or all."""
    from torch.distributed.checkpoint.api import CheckpointException

    from kiln.training.checkpoint.dcp_io import make_reader

    ckpt = resolve(path)
    try:
        reader = make_reader(ckpt)
        keys = set(reader.read_metadata().state_dict_metadata)
        if prefix is not None:
            keys = {k for k in keys if k.startswith(prefix + ".")}
        state = _load_keys(keys, make_reader(ckpt))
    except (Exception, CheckpointException) as exc:  # truncated/corrupt files: one line
        raise InputError(f"{ckpt}: {storage.read_failure(exc)}") from exc
    return state[prefix] if prefix is not None else state


def _load_keys(keys: set[str], reader) -> dict[str, Any]:
    """torch's `_load_state_dict_from_keys` with a planner that never unpickles (`safe_reader`)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from kiln.training.checkpoint.safe_reader import SafeKeysLoadPlanner

    state: dict[str, Any] = {}
    _load_state_dict(
        state_dict=state,
        storage_reader=reader,
        no_dist=not (dist.is_available() and dist.is_initialized()),
        planner=SafeKeysLoadPlanner(keys=keys),
    )
    return state


def load_model_state(ckpt_dir: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(model config dict, state dict with global parameter names) of a checkpoint or a root."""
    ckpt = resolve(ckpt_dir)
    return read_sidecar(ckpt).get("model", {}), load_state(ckpt, "model")


def latest_checkpoint(root: str) -> str | None:
    return storage.latest_checkpoint(root)
