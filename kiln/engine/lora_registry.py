"""The LoRA adapters an engine serves, by name: added and removed from any thread (the REST
routes' `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`, `kiln serve --lora`), read at
submit time. A request holds its adapter itself, so removing a name fails no request already
submitted: it finishes with the weights it started with; later requests for the name are refused.
Which adapters sit in the forward's slots is `LoRASlots`' business (engine thread)."""

from __future__ import annotations

import threading

from torch import nn

from kiln.engine.lora_adapter import LoRAAdapter, read_lora_adapter
from kiln.engine.lora_batch import LoRASlots
from kiln.platform.errors import InputError

DEFAULT_MAX_LORA_RANK = 16  # vLLM's default max_lora_rank


class UnknownAdapter(InputError):
    """A request or an unload named no adapter this engine serves."""


class LoRARegistry:
    def __init__(
        self, model: nn.Module, max_loras: int, max_rank: int = DEFAULT_MAX_LORA_RANK
    ) -> None:
        if max_loras < 1 or max_rank < 1:
            raise InputError("max_loras and max_lora_rank must be >= 1")
        self.model = model
        self.slots = LoRASlots(model, max_loras, max_rank)
        self._adapters: dict[str, LoRAAdapter] = {}
        self._lock = threading.Lock()

    def add(self, name: str, path: str) -> LoRAAdapter:
        """Read the PEFT folder at `path` and serve it as `name` (InputError naming lora_name or
        lora_path when the name is taken or the folder does not fit the model)."""
        if not name or not name.strip():
            raise InputError("lora_name: empty")
        with self._lock:
            if name in self._adapters:
                raise InputError(f"lora_name: adapter {name!r} is already loaded")
        adapter = read_lora_adapter(name, path, self.model, self.slots.max_rank)
        with self._lock:
            if name in self._adapters:  # loaded by another caller meanwhile
                raise InputError(f"lora_name: adapter {name!r} is already loaded")
            self._adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> None:
        with self._lock:
            if self._adapters.pop(name, None) is None:
                raise UnknownAdapter(f"lora_name: no adapter named {name!r} is loaded")

    def get(self, name: str) -> LoRAAdapter:
        with self._lock:
            adapter = self._adapters.get(name)
        if adapter is None:
            raise UnknownAdapter(f"model: no LoRA adapter named {name!r} is loaded")
        return adapter

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._adapters

    def adapters(self) -> list[LoRAAdapter]:
        """In load order."""
        with self._lock:
            return list(self._adapters.values())

    # ---- the engine's side: admission, a forward's rows, counts -----------------------------

    def admit(self, request, running: list) -> bool:
        """The scheduler's admission check: the request's adapter gets a slot."""
        return self.slots.admit(request.lora, [r.lora for r in running])

    def rows(self, requests: list, device):
        """Each row's adapter for the forward inside (a context manager)."""
        return self.slots.rows([r.lora for r in requests], device)

    def stats(self) -> dict[str, float]:
        slots = self.slots
        return {
            "lora_adapters_loaded": len(self.adapters()),
            "lora_adapters_resident": len(slots.resident()),
            "lora_slot_loads": slots.loads,
            "lora_slot_evictions": slots.evictions,
        }
