"""The Kiln checkpoint layout as a weight format: read a checkpoint's model in one process
(without torch.distributed), and write a weights-only checkpoint that the trainer's
`Checkpointer` resumes from (`init_from:`) like any checkpoint of its own.

Layout (DCP flattens nested dicts into dotted keys): `model.<fqn>` tensors and `train.step` /
`train.tokens_seen` in a step folder `step-NNNNNNNN/` with the `kiln.json` sidecar, and a
`latest` pointer in the root naming the newest complete one.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from kiln.model.config import ModelConfig
from kiln.model.formats import storage
from kiln.model.formats.dcp_io import WRITE_ERRORS, make_reader, make_writer
from kiln.model.formats.safe_reader import SafeKeysLoadPlanner
from kiln.model.fused_projections import model_state_dict
from kiln.platform.errors import InputError

CHECKPOINT_FORMAT = "kiln-dcp-v1"


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


def is_checkpoint(path: str) -> bool:
    """A complete checkpoint folder, or a root whose `latest` pointer names one."""
    path = path.rstrip("/")
    return storage.is_complete(path) or storage.latest_checkpoint(path) is not None


def read_sidecar(path: str) -> dict[str, Any]:
    return storage.read_json(storage.join(resolve(path), storage.SIDECAR))


def load_state(path: str, prefix: str | None = None) -> dict[str, Any]:
    """Full (unsharded) tensors of every key under `prefix` ("model", "optimizer", ...) or all."""
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


def read_checkpoint(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Model config and full state dict of a checkpoint (a step folder, or a root with `latest`),
    in one process (DCP reshards whatever layout wrote it). An adapter-only checkpoint gives its
    adapters only (`weights.read_weights` merges them onto their base)."""
    with warnings.catch_warnings():  # one process, no process group: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is")
        cfg, state = load_model_state(path)
    if not cfg:
        raise InputError(f"{path}: the checkpoint's kiln.json has no model config")
    return ModelConfig(**cfg), state


def write_checkpoint(out_dir: str, model: torch.nn.Module, *, step: int = 0) -> str:
    """A weights-only checkpoint of `model` (a `Transformer`): `<out>/step-N/` (DCP + kiln.json)
    and `<out>/latest`, so `train` (`init_from:`), `export` and `Generator.load` read it like
    any other. Returns the step folder."""
    path = storage.join(out_dir, storage.step_dir_name(step))
    storage.remove(path)  # a half-written folder a crash left at this step
    fs, local = storage.fs_and_path(path)
    fs.makedirs(local, exist_ok=True)
    state = {
        "model": model_state_dict(model),
        "train": {"step": int(step), "tokens_seen": 0},
    }
    try:
        with warnings.catch_warnings():  # one process, no process group: that is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is")
            dcp.save(state, storage_writer=make_writer(path), no_dist=True)
    except WRITE_ERRORS as exc:
        cause = storage.write_failure(path, exc)
        storage.remove(path)
        raise InputError(f"{path}: writing the checkpoint failed ({cause})") from exc
    storage.write_json(storage.join(path, storage.SIDECAR), _sidecar(model, step))
    storage.set_latest(out_dir, path)
    if not storage.is_complete(path):
        raise InputError(f"{path}: writing did not produce a complete checkpoint")
    return path


def _sidecar(model: torch.nn.Module, step: int) -> dict[str, Any]:
    """The `kiln.json` the trainer's `Checkpointer` writes, for a one-process weights-only save."""
    return {
        "format": CHECKPOINT_FORMAT,
        "step": int(step),
        "model_only": False,
        "tokens_seen": 0,
        "model": model.cfg.checkpoint_dump(),
        "layout": {"world_size": 1, "dp_size": 1, "parallel": None},
        "dataloader": None,
        "train_config": None,
        "saved_at": time.time(),
    }
