"""Adapter-only checkpoints as a weight format: a LoRA run's checkpoint holds the adapters and a
reference to its base (the base's path and a fingerprint of its weight files) instead of the
frozen base weights; reading one merges the adapters into the base it names, and the base must
still match the fingerprint."""

from __future__ import annotations

import hashlib
import os
from functools import cache
from typing import Any

import torch

from kiln.model.formats.checkpoint import read_sidecar, resolve
from kiln.model.lora import LoRAConfig, adapter_state_dict, merged_state_dict
from kiln.platform.errors import InputError

_CHUNK = 1 << 22


def _weight_files(path: str) -> list[str]:
    """The files that define a base's weights: a HF folder's config + safetensors, or every
    file of a kiln checkpoint's step folder."""
    if os.path.isdir(os.path.join(path, "hf")):
        path = os.path.join(path, "hf")
    if os.path.isfile(os.path.join(path, "config.json")):
        names = ["config.json"] + sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
        return [os.path.join(path, n) for n in names]
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


def adapter_sidecar(base: str, lora: dict[str, Any]) -> dict[str, Any]:
    """The `adapter_only` entry of an adapter checkpoint's `kiln.json`."""
    return {"base": base, "base_sha256": base_fingerprint(base), "lora": lora}


def adapter_reference(ckpt: str) -> dict[str, Any] | None:
    """The base an adapter-only checkpoint refers to (its sidecar entry), or None for a
    checkpoint that carries its own weights."""
    return read_sidecar(ckpt).get("adapter_only") or None


def adapter_scaling(ref: dict[str, Any]) -> float:
    return LoRAConfig(**ref["lora"]).scaling


def check_base(sidecar: dict, ckpt: str, base: str) -> None:
    """An adapter checkpoint resumes, or is read, only onto the base it was trained on."""
    ref = sidecar.get("adapter_only")
    if not ref:
        return  # a full checkpoint (or an imported base): it carries its own weights
    if base_fingerprint(os.path.abspath(base)) != ref["base_sha256"]:
        raise InputError(
            f"{ckpt}: its adapters were trained on base {ref['base']} "
            f"(sha256 {ref['base_sha256'][:12]}…), which differs from base {base}"
        )


def merge_adapters(
    base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """The base's weights with the LoRA entries of `adapters` merged in (adapters dropped)."""
    return merged_state_dict({**base, **adapter_state_dict(adapters)}, scaling)
