"""Adapter-only checkpoints for LoRA runs: the adapters, their optimizer state and the run's
position, plus a reference to the base (its path and a fingerprint of its weight files) instead
of the frozen base weights.

Resume builds the model from the base as a fresh run does and loads the adapters over it (the
fingerprint must match: a changed base raises); `kiln export` / `read_weights` of such a
checkpoint merge the adapters into the referenced base (`merge_adapter_checkpoint`).
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from kiln.platform.errors import InputError
from kiln.training.checkpoint import Checkpointer, storage
from kiln.training.model.lora import LORA_PARAMS

_CHUNK = 1 << 22


def _weight_files(path: str) -> list[str]:
    """The files that define a base's weights: a HF folder's config + safetensors, or every
    file of a kiln checkpoint's step folder."""
    if os.path.isdir(os.path.join(path, "hf")):
        path = os.path.join(path, "hf")
    if os.path.isfile(os.path.join(path, "config.json")):
        names = ["config.json"] + sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        return [os.path.join(path, n) for n in names]
    from kiln.training.checkpoint.offline import resolve

    step = resolve(path)
    return [
        os.path.join(step, n)
        for n in sorted(os.listdir(step))
        if os.path.isfile(os.path.join(step, n))
    ]


@cache
def base_fingerprint(path: str) -> str:
    """sha256 over the base's weight files (names and bytes), computed once per process."""
    digest = hashlib.sha256()
    for file in _weight_files(os.path.abspath(path)):
        digest.update(os.path.basename(file).encode())
        with open(file, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _is_adapter(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in LORA_PARAMS


class AdapterCheckpointer(Checkpointer):
    """A Checkpointer whose model entries are the LoRA adapters only; the sidecar names the base."""

    def __init__(self, *args, base: str, lora: dict[str, Any], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.base = os.path.abspath(base)
        self.lora = lora

    def _model_state(self) -> tuple[dict[str, Any], list[list[str]]]:
        state, keys = super()._model_state()
        keys = [[k for k in part if _is_adapter(k)] for part in keys]
        return {k: state[k] for part in keys for k in part}, keys

    def _apply_model_state(self, state: dict[str, Any], keys: list[list[str]]) -> None:
        options = StateDictOptions(strict=False)  # the base weights are loaded from `base`
        for part, part_keys in zip(self.model_parts, keys, strict=True):
            set_model_state_dict(part, {k: state[k] for k in part_keys}, options=options)

    def _sidecar(self, step: int) -> dict[str, Any]:
        sidecar = super()._sidecar(step)
        sidecar["adapter_only"] = {
            "base": self.base,
            "base_sha256": base_fingerprint(self.base),
            "lora": self.lora,
        }
        return sidecar

    def load(self) -> bool:
        source = self._source()
        if source is not None and storage.is_complete(source[0]):
            sidecar = storage.read_json(storage.join(source[0], storage.SIDECAR))
            check_base(sidecar, source[0], self.base)
        return super().load()


def check_base(sidecar: dict, ckpt: str, base: str) -> None:
    """An adapter checkpoint resumes only onto the base it was trained on."""
    ref = sidecar.get("adapter_only")
    if not ref:
        return  # a full checkpoint (or an imported base): it carries its own weights
    if base_fingerprint(os.path.abspath(base)) != ref["base_sha256"]:
        raise InputError(
            f"{ckpt}: its adapters were trained on base {ref['base']} "
            f"(sha256 {ref['base_sha256'][:12]}…), which differs from base {base}"
        )


def merge_adapter_checkpoint(ckpt: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's full model state: unchanged for a full checkpoint; for an adapter-only one
    the referenced base's weights with the adapters merged in (the base must still match)."""
    from kiln.training.checkpoint.offline import read_sidecar
    from kiln.training.model.lora import LoRAConfig, merged_state_dict
    from kiln.training.model.weights import read_weights

    ref = read_sidecar(ckpt).get("adapter_only")
    if not ref:
        return state
    if not os.path.exists(ref["base"]):
        raise InputError(f"{ckpt}: its base {ref['base']} is missing (adapter-only checkpoint)")
    check_base({"adapter_only": ref}, ckpt, ref["base"])
    _, _, base_state = read_weights(ref["base"])
    combined = {**base_state, **{k: v for k, v in state.items() if _is_adapter(k)}}
    return merged_state_dict(combined, LoRAConfig(**ref["lora"]).scaling)
