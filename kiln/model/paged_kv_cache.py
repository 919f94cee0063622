"""A paged key/value cache: fixed-size blocks in one pool per layer, a block table per sequence.

Sequences hold lists of block ids instead of rows, so blocks can be shared (a cached prefix) and
memory follows the tokens held, not batch x context. A forward sees a batch of sequences through
`PagedKVCache.batch(...)`, which speaks the same contract as `KVCache` (positions, begin,
layer/update, advance), so `Transformer.forward` stays the one forward: `update` writes each
new token's keys/values into its block slot, then gathers every row's blocks into the
[B, Hkv, end, Dh] keys/values the attention core reads.
"""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.kv_cache import LayerKV
from kiln.model.packed_batch import PackedBatch

NULL_BLOCK = 0  # never handed to a sequence: pads write here, short rows' tables point here


class PagedKVCache:
    """`num_blocks` blocks of `block_size` tokens per layer: k[l], v[l] of shape
    [num_blocks, block_size, n_kv_heads, head_dim]. Block 0 is the null block (a sink for pad
    tokens and the filler of short block tables). Storage is allocated empty and zeroed as
    blocks are first used (doubling), so a large budget costs memory only as it fills; a zeroed
    block keeps finite values for ever, which matters because masked keys still meet a 0 weight
    in the attention product (0 * NaN would be NaN). An MLA model (`cfg.mla`) caches one
    "head": its latent in `k` (kv_lora_rank wide) and its RoPE key in `v` (qk_rope_head_dim)."""

    def __init__(
        self,
        n_layers: int,
        num_blocks: int,
        block_size: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        sliding_window: int | None = None,
        local_layers: frozenset[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        v_head_dim: int | None = None,
    ) -> None:
        """`v_head_dim`: the width of `v` when it differs from `k`'s (MLA's RoPE key)."""
        if num_blocks < 2 or block_size < 1:
            raise ValueError("a paged KV cache needs >= 2 blocks (one is the null block)")
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        v_shape = (*shape[:3], v_head_dim or head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.empty(v_shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.local_layers = local_layers
        self.device = torch.device(device) if device is not None else self.k[0].device
        self.zeroed = 0  # blocks [0, zeroed) hold finite values
        self.zero_through(NULL_BLOCK)
        # where a layer's gathered keys and values go: reused by every layer and step (a fresh
        # multi-MB tensor per layer costs page faults that took longer than the copy itself)
        self._gathered = torch.empty(0, dtype=dtype, device=device)

    @classmethod
    def for_model(
        cls,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> PagedKVCache:
        heads, k_dim, v_dim = _cached_widths(cfg)
        return cls(
            cfg.n_layers,
            num_blocks,
            block_size,
            heads,
            k_dim,
            v_head_dim=v_dim,
            sliding_window=cfg.sliding_window,
            local_layers=frozenset(i for i in range(cfg.n_layers) if cfg.is_local_layer(i)),
            dtype=dtype,
            device=device,
        )

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        """Keys and values of one block over every layer."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        heads, k_dim, v_dim = _cached_widths(cfg)
        return cfg.n_layers * block_size * heads * (k_dim + v_dim) * itemsize

    def zero_through(self, block: int) -> None:
        """Make blocks up to `block` finite: zero the untouched storage in doubling steps."""
        if block < self.zeroed:
            return
        stop = min(self.num_blocks, max(block + 1, 2 * self.zeroed, 8))
        for t in self.k + self.v:
            t[self.zeroed : stop].zero_()
        self.zeroed = stop

    def gather_buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two [rows, block_size * Hkv * Dh] buffers (keys, values) for one layer's gather;
        their contents last until the next layer's."""
        k_width, v_width = self.k[0][0].numel(), self.v[0][0].numel()
        size = rows * (k_width + v_width)
        if self._gathered.numel() < size:
            self._gathered = self._gathered.new_empty(size)
        k_part, v_part = self._gathered[:size].split([rows * k_width, rows * v_width])
        return k_part.view(rows, k_width), v_part.view(rows, v_width)

    def batch(self, block_tables: list[list[int]], lengths: list[int], seq_len: int) -> PagedBatch:
        """The forward view of these rows: row b holds lengths[b] tokens in block_tables[b] and
        gets `seq_len` new ones (pads included), whose blocks the table must already list; a
        pad position past the row's blocks is written to the null block."""
        bs = self.block_size
        end = max(lengths) + seq_len
        width = -(-end // bs)
        table = torch.full((len(block_tables), width), NULL_BLOCK, dtype=torch.long)
        for row, blocks in enumerate(block_tables):
            blocks = blocks[:width]
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
        self.zero_through(int(table.max()))
        starts = torch.tensor(lengths, dtype=torch.long)
        positions = starts[:, None] + torch.arange(seq_len)  # [B, S]
        slots = table.gather(1, positions // bs) * bs + positions % bs
        device = self.device
        return PagedBatch(
            self, table.to(device), starts.to(device), slots.reshape(-1).to(device), end, seq_len
        )

    def packed(
        self,
        block_tables: list[list[int]],
        lengths: list[int],
        counts: list[int],
        *,
        in_place: bool | None = None,
    ) -> PackedBatch:
        """The forward view of these rows packed into one [1, sum(counts)] sequence, no pads:
        row b's `counts[b]` new tokens after its `lengths[b]` cached ones (packed_batch.py;
        `in_place`: decoding rows through the paged attention op, None where available)."""
        return PackedBatch(self, block_tables, lengths, counts, in_place=in_place)


def _cached_widths(cfg: ModelConfig) -> tuple[int, int, int]:
    """(heads, k width, v width) a token caches per layer: GQA's keys and values, or MLA's
    latent and RoPE key."""
    if cfg.mla is not None:
        return 1, cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim
    return cfg.n_kv_heads, cfg.head_dim, cfg.head_dim


class PagedBatch:
    """One forward's rows of a `PagedKVCache`, with `KVCache`'s contract for
    `Transformer.forward`: new tokens go to slots `lengths[b] + i`, each query sees its own
    row's positions up to its own (within a sliding window on local layers)."""

    def __init__(
        self,
        cache: PagedKVCache,
        table: torch.Tensor,
        lengths: torch.Tensor,
        write_slots: torch.Tensor,
        end: int,
        seq_len: int,
    ) -> None:
        self.cache = cache
        self.table = table  # [B, blocks]
        self.lengths = lengths  # [B]
        self.write_slots = write_slots  # [B * S] flat slot of each new token
        self.end = end
        self.seq_len = seq_len
        self._masks: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def positions(self, seq_len: int) -> torch.Tensor:
        return self.lengths[:, None] + torch.arange(seq_len, device=self.lengths.device)

    def begin(self, seq_len: int) -> None:
        if seq_len != self.seq_len:
            raise ValueError(f"this paged batch was laid out for {self.seq_len} new tokens")
        query = self.positions(seq_len)
        key = torch.arange(self.end, device=query.device)
        causal = key[None, None, :] <= query[:, :, None]  # [B, S, end]
        windowed = causal
        window = self.cache.sliding_window
        if window is not None:
            windowed = causal & (query[:, :, None] - key[None, None, :] < window)
        self._masks = (causal[:, None], windowed[:, None])

    def layer(self, index: int) -> LayerKV:
        return LayerKV(self, index)

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write k/v [B, Hkv, S, Dh] into their slots; return every row's keys and values
        [B, Hkv, end, Dh] gathered from its blocks (into buffers the next layer reuses: the
        attention consumes them at once), and the mask [B, 1, S, end]."""
        if self._masks is None:
            raise RuntimeError("PagedBatch.begin(seq_len) must precede update()")
        cache = self.cache
        local = cache.local_layers is None or layer in cache.local_layers
        mask = self._masks[1] if local else self._masks[0]
        out = []
        index = self.table.view(-1)
        buffers = cache.gather_buffers(index.numel())
        for pool, new, buffer in zip(
            (cache.k[layer], cache.v[layer]), (k, v), buffers, strict=True
        ):
            # 2-D views: index_select/index_copy_ over whole rows of a matrix run as memcpys,
            # over a 4-D tensor ~40x slower (bench/prefix_cache.py --part decode)
            slots = pool.view(-1, new.shape[1] * new.shape[3])  # [blocks * bs, Hkv * Dh]
            new = new.transpose(1, 2).reshape(-1, slots.shape[1]).to(slots.dtype)
            slots.index_copy_(0, self.write_slots, new)
            blocks = pool.view(pool.shape[0], -1)  # [blocks, bs * Hkv * Dh]
            rows = torch.index_select(blocks, 0, index, out=buffer)
            rows = rows.view(self.batch, -1, *pool.shape[2:])[:, : self.end]  # [B, end, Hkv, Dh]
            out.append(rows.transpose(1, 2))
        return out[0], out[1], mask

    def advance(self, seq_len: int) -> None:
        self.lengths = self.lengths + seq_len
        self._masks = None
