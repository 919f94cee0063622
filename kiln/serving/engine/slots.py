"""A fixed pool of KV-cache slots: one row of preallocated keys/values per running sequence."""

from __future__ import annotations

import torch

from kiln.training.model.config import ModelConfig
from kiln.training.model.kv_cache import KVCache


class SlotPool:
    """`size` KV-cache rows of `max_len` tokens, allocated once; a sequence holds one row from
    its first prefill chunk to its last token. Forwards run over `view`s: a `KVCache` whose
    storage is a slice of the pool's rows (writes land in the pool) and whose lengths are the
    ones the engine keeps per slot."""

    def __init__(
        self,
        cfg: ModelConfig,
        size: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.cache = KVCache.for_model(cfg, size, max_len, dtype=dtype, device=device)
        self.size = size
        self.lengths = [0] * size  # tokens cached per slot
        self._free = list(range(size))  # lowest first: busy rows stay packed at the front

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        slot = min(self._free)
        self._free.remove(slot)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    def view(self, start: int, stop: int) -> KVCache:
        """A cache over slots start..stop-1 (the same storage), at their current lengths."""
        full = self.cache
        view = KVCache(0, 0, 1, 1, full.max_len, sliding_window=full.sliding_window)
        view.k = [t[start:stop] for t in full.k]
        view.v = [t[start:stop] for t in full.v]
        view.lengths = torch.tensor(self.lengths[start:stop], device=full.lengths.device)
        return view
