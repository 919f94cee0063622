"""The non-tensor training state in a checkpoint (each rank's RNG states, each dp rank's loader
position) as JSON bytes, so loading a checkpoint never unpickles it.

Checkpoints written before this held pickled bytes there: their loader position is read from the
`kiln.json` sidecar instead (loaders keep a global position), and their RNG state is not
restored (a warning says so)."""

from __future__ import annotations

import base64
import json
import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger("kiln.checkpoint")


def is_json(blob: bytes) -> bool:
    return bytes(blob[:1]) == b"{"


def encode_loader(state: dict[str, Any]) -> bytes:
    return json.dumps(state, sort_keys=True).encode()


def decode_loader(blob: bytes, sidecar: dict[str, Any]) -> dict[str, Any] | None:
    if is_json(blob):
        return json.loads(bytes(blob))
    log.warning("checkpoint data-loader state is in the old pickled format: using kiln.json's")
    return sidecar.get("dataloader")


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().contiguous().numpy().tobytes()).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def encode_rng() -> bytes:
    """This rank's Python, NumPy, torch (and CUDA) generator states."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else None
    state = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _b64(torch.get_rng_state()),
        "cuda": cuda,
    }
    return json.dumps(state).encode()


def restore_rng(blob: bytes) -> None:
    if not is_json(blob):
        log.warning("checkpoint RNG state is in the old pickled format: not restored")
        return
    state = json.loads(bytes(blob))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    keys = np.array(npy["keys"], dtype=np.uint32)
    np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(_tensor(state["torch"]))
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(s) for s in state["cuda"]])
