"""A preallocated key/value cache for incremental decoding through `Transformer.forward`."""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig


class KVCache:
    """Keys and values of every layer for B independent rows, plus each row's length.

    Contract (what `Transformer.forward(tokens, kv_cache=cache)` does with it):

    * Storage: per layer `k[l]`, `v[l]` of shape [B, n_kv_heads, max_len, head_dim], allocated
      once. Row b's tokens sit at slots 0 .. lengths[b]-1, and a token's slot is its position.
    * A forward of tokens [B, S] writes row b's S new keys/values at slots lengths[b] ..
      lengths[b]+S-1, gives them RoPE positions lengths[b]+i, lets each query see its own row's
      slots up to its position (and, with a sliding window, only the last `window` of them), then
      advances every row by S. Rows of different lengths therefore share one batched step
      (a continuous-batching decode step is tokens [B, 1] with rows at any length).
    * Ragged steps: right-pad the rows to S tokens, run the forward, then `truncate(lengths)` to
      each row's true length. Pad tokens' outputs are meaningless; their keys/values lie beyond
      the row's length, are never attended to, and the next step overwrites them.
    * Capacity: every row needs lengths[b] + S <= max_len (ValueError otherwise).
    * Rows: `reset(rows)` empties rows for new sequences, `keep_rows(rows)` drops the others.
    * MLA (`cfg.mla`): one "head" per layer; `k` holds the normed kv latent (kv_lora_rank wide)
      and `v` the rotated RoPE key (qk_rope_head_dim wide), the only numbers MLA caches.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        sliding_window: int | None = None,
        local_layers: frozenset[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        v_head_dim: int | None = None,
    ) -> None:
        """`local_layers`: the layers that attend within `sliding_window` (None: all of them;
        Gemma 3 interleaves them with global layers). `v_head_dim`: the width of `v` when it
        differs from `k`'s (MLA's RoPE key beside its latent)."""
        shape = (batch, n_kv_heads, max_len, head_dim)
        v_shape = (*shape[:3], v_head_dim or head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(v_shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.max_len = max_len
        self.sliding_window = sliding_window
        self.local_layers = local_layers
        # (slots, causal mask, windowed mask, end)
        self._step: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None

    @classmethod
    def for_model(
        cls,
        cfg: ModelConfig,
        batch: int,
        max_len: int | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """A cache shaped for `cfg` (max_len defaults to, and may not exceed, cfg.max_seq_len)."""
        max_len = min(max_len or cfg.max_seq_len, cfg.max_seq_len)
        heads, k_dim, v_dim = cfg.n_kv_heads, cfg.head_dim, cfg.head_dim
        if cfg.mla is not None:
            heads, k_dim, v_dim = 1, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim
        return cls(
            cfg.n_layers,
            batch,
            heads,
            k_dim,
            max_len,
            v_head_dim=v_dim,
            sliding_window=cfg.sliding_window,
            local_layers=frozenset(i for i in range(cfg.n_layers) if cfg.is_local_layer(i)),
            dtype=dtype,
            device=device,
        )

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def bytes_per_token(self) -> int:
        """Cache bytes one token takes over all layers (keys + values, or MLA's latent + key)."""
        return sum(t.shape[1] * t.shape[3] * t.element_size() for t in self.k + self.v)

    # -- one forward step (called by Transformer.forward) --------------------------------------

    def positions(self, seq_len: int) -> torch.Tensor:
        """RoPE positions [B, S] of the next `seq_len` tokens of every row."""
        return self.lengths[:, None] + torch.arange(seq_len, device=self.lengths.device)

    def begin(self, seq_len: int) -> None:
        """Prepare the write slots and the attention mask shared by every layer of one step."""
        end = int(self.lengths.max()) + seq_len
        if end > self.max_len:
            raise ValueError(f"KV cache is full: a row needs {end} of {self.max_len} slots")
        query = self.positions(seq_len)  # [B, S]
        key = torch.arange(end, device=self.lengths.device)
        causal = key[None, None, :] <= query[:, :, None]  # [B, S, end]
        windowed = causal
        if self.sliding_window is not None:
            windowed = causal & (query[:, :, None] - key[None, None, :] < self.sliding_window)
        self._step = (query, causal[:, None], windowed[:, None], end)

    def layer(self, index: int) -> LayerKV:
        return LayerKV(self, index)

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write this step's k/v [B, Hkv, S, Dh]; return the row's keys, values [B, Hkv, end, Dh]
        and the boolean mask [B, 1, S, end] (True = attend) for this step's queries."""
        if self._step is None:
            raise RuntimeError("KVCache.begin(seq_len) must precede update()")
        slots, causal, windowed, end = self._step
        local = self.local_layers is None or layer in self.local_layers
        mask = windowed if local else causal
        for cache, new in ((self.k[layer], k), (self.v[layer], v)):
            index = slots[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3])
            cache.scatter_(2, index, new.to(cache.dtype))
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end], mask

    def advance(self, seq_len: int) -> None:
        self.lengths = self.lengths + seq_len
        self._step = None

    # -- row bookkeeping ---------------------------------------------------------------------

    def truncate(self, lengths: torch.Tensor) -> None:
        """Set every row's length (<= its current one): forget tokens past it (pads, rejects)."""
        lengths = lengths.to(self.lengths, copy=True)
        if bool((lengths > self.lengths).any()):
            raise ValueError("truncate() cannot lengthen a row")
        self.lengths = lengths

    def reset(self, rows: torch.Tensor) -> None:
        """Empty these rows (a new sequence starts there)."""
        self.lengths = self.lengths.index_fill(0, rows.to(self.lengths.device), 0)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows, in this order (finished sequences leave the batch)."""
        rows = rows.to(self.lengths.device)
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.lengths = self.lengths.index_select(0, rows)


class LayerKV:
    """One layer's view of a cache (a `KVCache` or a paged one: anything with
    `update(layer, k, v)`), which is what an `Attention` module is handed."""

    __slots__ = ("cache", "index")

    def __init__(self, cache, index: int) -> None:
        self.cache, self.index = cache, index

    def update(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cache.update(self.index, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, core) -> torch.Tensor:
        """`core`'s attention of q over the cache after appending k/v: the cache's own
        (a packed batch attends row by row, packed_batch.py), else over what `update` returns."""
        attend = getattr(self.cache, "attend", None)
        if attend is not None:
            return attend(self.index, q, k, v, core)
        k, v, mask = self.cache.update(self.index, k, v)
        return core(q, k, v, mask=mask)
