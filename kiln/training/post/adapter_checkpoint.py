"""Adapter-only checkpoints for LoRA runs: the adapters, their optimizer state and the run's
position, plus a reference to the base (its path and a fingerprint of its weight files) instead
of the frozen base weights.

Resume builds the model from the base as a fresh run does and loads the adapters over it (the
fingerprint must match: a changed base raises); `kiln export` / `read_weights` of such a
checkpoint merge the adapters into the referenced base (kiln.model.formats.adapter_checkpoint).
"""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from kiln.model.formats import storage
from kiln.model.formats.adapter_checkpoint import adapter_sidecar, base_fingerprint, check_base
from kiln.model.lora import LORA_PARAMS
from kiln.training.checkpoint.checkpointer import Checkpointer

__all__ = ["AdapterCheckpointer", "base_fingerprint", "check_base"]


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
        sidecar["adapter_only"] = adapter_sidecar(self.base, self.lora)
        return sidecar

    def load(self) -> bool:
        source = self._source()
        if source is not None and storage.is_complete(source[0]):
            sidecar = storage.read_json(storage.join(source[0], storage.SIDECAR))
            check_base(sidecar, source[0], self.base)
        return super().load()
