"""A fixed pool of KV-cache slots: one row of keys/values per running sequence, grown on demand."""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.kv_cache import KVCache

# Tokens per row allocated at start; rows double (up to the context) when a forward needs more,
# so a replica does not zero pages for a whole context per slot before its first answer
# (bench/engine_start.py compares the two).
FIRST_ROW_TOKENS = 256


class SlotPool:
    """`size` KV-cache rows of up to `max_len` tokens; a sequence holds one row from its first
    prefill chunk to its last token. Storage starts at FIRST_ROW_TOKENS per row and doubles when
    a forward needs more, so memory follows the longest sequence seen, not the context. Forwards
    run over `view`s: a `KVCache` whose storage is a slice of the pool's rows (writes land in the
    pool) and whose lengths are the ones the engine keeps per slot."""

    def __init__(
        self,
        cfg: ModelConfig,
        size: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.max_len = min(max_len, cfg.max_seq_len)  # the context: no row grows past it
        first = min(self.max_len, FIRST_ROW_TOKENS)
        self.cache = KVCache.for_model(cfg, size, first, dtype=dtype, device=device)
        self.size = size
        self.lengths = [0] * size  # tokens cached per slot
        self._free = list(range(size))  # lowest first: busy rows stay packed at the front

    @property
    def allocated(self) -> int:
        """Tokens per row the storage holds now (<= max_len)."""
        return self.cache.max_len

    def reserve(self, end: int) -> None:
        """Make every row hold `end` tokens: double the storage (at most to max_len) and copy
        what the rows hold. Views taken before a growth must not be used after it."""
        have = self.cache.max_len
        if end <= have:
            return
        if end > self.max_len:
            raise ValueError(f"KV cache is full: a row needs {end} of {self.max_len} slots")
        grown = min(self.max_len, max(end, 2 * have))
        for parts in (self.cache.k, self.cache.v):
            for i, old in enumerate(parts):
                new = old.new_zeros(*old.shape[:2], grown, old.shape[3])
                new[:, :, :have] = old
                parts[i] = new
        self.cache.max_len = grown

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

    def view(self, start: int, stop: int, seq_len: int) -> KVCache:
        """A cache over slots start..stop-1 (the same storage), at their current lengths, with
        room for `seq_len` more tokens in each."""
        self.reserve(max(self.lengths[start:stop]) + seq_len)
        full = self.cache
        view = KVCache(
            0,
            0,
            1,
            1,
            full.max_len,
            sliding_window=full.sliding_window,
            local_layers=full.local_layers,
        )
        view.k = [t[start:stop] for t in full.k]
        view.v = [t[start:stop] for t in full.v]
        view.lengths = torch.tensor(self.lengths[start:stop], device=full.lengths.device)
        return view

    def gather(self, slots: list[int], seq_len: int) -> KVCache:
        """A cache holding copies of these slots' rows (only up to the longest + `seq_len`):
        several prefills in one forward when their slots are not neighbours. Nothing reaches
        the pool until `scatter`, so a failed forward leaves every slot as it was."""
        end = max(self.lengths[s] for s in slots) + seq_len
        self.reserve(end)
        full = self.cache
        rows = torch.tensor(slots, device=full.lengths.device)
        view = KVCache(
            0, 0, 1, 1, end, sliding_window=full.sliding_window, local_layers=full.local_layers
        )
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
