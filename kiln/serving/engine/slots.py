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

    def swap(self, a: int, b: int) -> None:
        """Exchange two slots' rows (keys/values up to the longer one, lengths, free or not):
        the engine packs decoding rows to the front so a decode step skips idle slots."""
        n = max(self.lengths[a], self.lengths[b])
        if n:
            rows, swapped = [a, b], [b, a]
            for t in self.cache.k + self.cache.v:
                t[rows, :, :n] = t[swapped, :, :n]  # the right side is a copy
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]
        a_free, b_free = a in self._free, b in self._free
        if a_free != b_free:
            self._free.remove(a if a_free else b)
            self._free.append(b if a_free else a)

    def fits(self, slot: int, seq_len: int) -> bool:
        """Whether `seq_len` more tokens (pads included) fit in this slot's row."""
        return self.lengths[slot] + seq_len <= self.max_len

    def view(self, start: int, stop: int) -> KVCache:
        """A cache over slots start..stop-1 (the same storage), at their current lengths."""
        full = self.cache
        view = KVCache(0, 0, 1, 1, full.max_len, sliding_window=full.sliding_window)
        view.k = [t[start:stop] for t in full.k]
        view.v = [t[start:stop] for t in full.v]
        view.lengths = torch.tensor(self.lengths[start:stop], device=full.lengths.device)
        return view

    def gather(self, slots: list[int], seq_len: int) -> KVCache:
        """A cache holding copies of these slots' rows (only up to the longest + `seq_len`):
        several prefills in one forward when their slots are not neighbours. Nothing reaches
        the pool until `scatter`, so a failed forward leaves every slot as it was."""
        full = self.cache
        end = max(self.lengths[s] for s in slots) + seq_len
        rows = torch.tensor(slots, device=full.lengths.device)
        view = KVCache(0, 0, 1, 1, end, sliding_window=full.sliding_window)
        view.k = [t[rows, :, :end] for t in full.k]  # advanced indexing: copies
        view.v = [t[rows, :, :end] for t in full.v]
        view.lengths = torch.tensor([self.lengths[s] for s in slots], device=rows.device)
        return view

    def scatter(self, view: KVCache, slots: list[int]) -> None:
        """Write a `gather`ed cache back into its slots."""
        rows = torch.tensor(slots, device=self.cache.lengths.device)
        end = view.max_len
        for pool, part in zip(self.cache.k + self.cache.v, view.k + view.v, strict=True):
            pool[rows, :, :end] = part
