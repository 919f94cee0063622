"""Rows of a `PagedKVCache` packed side by side into one [1, T] forward, vLLM's flattened batch:
every row's new tokens follow each other with no pads, so the projections, norms and MLP (per
token) compute T real tokens, and the weights are streamed once per engine step for decoding
rows and prompt chunks together. Only attention is per row: `attend` writes every token's
keys/values into its block slot, then runs the attention core piece by piece, where a piece is
one prompt chunk (its queries over its own context, causal) or a run of one-token rows (decoding,
one [rows, 1] attention over keys padded to the run's longest row). vLLM-CPU's torch SDPA
backend splits prefill and decode the same way. A prompt's first chunk (nothing cached before
it) attends over its own new keys/values as a full forward does: no gather, no mask.

Where the paged attention op is available (paged_attention.py: a small C++ op built once per
machine), a run of one-token rows skips the gather: each row attends over its blocks in place,
and the whole run is one piece (no padding to bound). Otherwise, or for a core with a score
soft-cap or the batch-invariant backend, decoding rows gather as above.

A model whose attention has a cache contract of its own (MLA's latent) keeps `PagedBatch`."""

from __future__ import annotations

import itertools

import torch

from kiln.model import paged_attention
from kiln.model.batch_invariance import invariant_bias
from kiln.model.kv_cache import LayerKV

DECODE_RUN_PADDING = 1.5  # a one-token row joins a run while its longest is <= this x its own
# ... and while the run gathers at most this many key slots: the gathered keys/values (~1.5 KB
# a slot for SmolLM2) are read by the attention while still in cache (a 32-row run of 600-slot
# rows took 6.0 ms a layer, in runs of 8-16 rows 4.6 ms)
DECODE_RUN_KEYS = 8192


class PackedBatch:
    """Built by `PagedKVCache.packed`: `counts[b]` new tokens of row b after its `lengths[b]`
    cached ones, rows in the given order; T = sum(counts). `in_place`: decoding rows attend
    through the paged attention op (None: wherever it is available for the cache's shape; the
    engine passes whether its model's attention can use the op, model_runner.decodes_in_place)."""

    def __init__(
        self,
        cache,
        block_tables: list[list[int]],
        lengths: list[int],
        counts: list[int],
        *,
        in_place: bool | None = None,
    ) -> None:
        self.cache = cache
        if in_place is None:
            in_place = paged_attention_takes(cache)
        self.in_place = in_place
        bs = cache.block_size
        ends = [n + c for n, c in zip(lengths, counts, strict=True)]
        width = -(-max(ends) // bs)
        padded = [(b + [0] * width)[:width] for b in block_tables]
        table = torch.tensor(padded, dtype=torch.long)
        cache.zero_through(max(map(max, padded)))
        # positions and slots in Python: a decode step has one token a row, for which a dozen
        # small tensor ops cost more than these lists
        spans = [range(n, end) for n, end in zip(lengths, ends, strict=True)]
        positions = [p for span in spans for p in span]
        slots = [
            b[p // bs] * bs + p % bs for b, span in zip(padded, spans, strict=True) for p in span
        ]
        first = list(itertools.accumulate(counts, initial=0))  # each row's first token
        self.seq_len = len(positions)
        device = cache.device
        self._positions = torch.tensor([positions], dtype=torch.long, device=device)  # [1, T]
        self.write_slots = torch.tensor(slots, dtype=torch.long, device=device)
        # pieces: (first token, rows, tokens per row, block table, end, query positions)
        self.pieces = []
        # a decoding piece's keys per row (its cached tokens and the new one), for the op
        self._ends: list[torch.Tensor | None] = []
        for lo, hi in _pieces(lengths, counts, bounded=not in_place):
            end = max(ends[lo:hi])
            rows_table = table[lo:hi, : -(-end // bs)].contiguous()
            query = torch.tensor([list(span) for span in spans[lo:hi]])
            self.pieces.append((first[lo], hi - lo, counts[lo], rows_table.to(device), end, query))
            self._ends.append(torch.tensor(ends[lo:hi], device=device) if in_place else None)
        self._masks: list[tuple[torch.Tensor | None, torch.Tensor | None]] | None = None
        self._folded: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def batch(self) -> int:
        return 1

    def positions(self, seq_len: int) -> torch.Tensor:
        return self._positions

    def begin(self, seq_len: int) -> None:
        if seq_len != self.seq_len:
            raise ValueError(f"this packed batch was laid out for {self.seq_len} tokens")
        window = self.cache.sliding_window
        masks = []
        for _, rows, n, _, end, query in self.pieces:
            if rows == 1 and end == n:  # a prompt's first chunk: the core's own causal mask
                masks.append((None, None))
                continue
            key = torch.arange(end)
            causal = key[None, None, :] <= query[:, :, None]  # [rows, n, end]
            device = self.cache.device
            if window is None:  # one mask object for both: prepared once (`_prepared_pair`)
                mask = causal[:, None].to(device)
                masks.append((mask, mask))
                continue
            windowed = causal & (query[:, :, None] - key[None, None, :] < window)
            masks.append((causal[:, None].to(device), windowed[:, None].to(device)))
        self._masks = masks
        self._folded = {}

    def layer(self, index: int) -> LayerKV:
        return LayerKV(self, index)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError("a packed batch attends per piece: use attend()")

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, core):
        """q [1, Hq, T, Dh], k/v [1, Hkv, T, Dh] -> attention output [1, Hq, T, Dh]: the new
        keys/values written to their slots, then `core(q, k, v, mask=...)` per piece over the
        piece's rows gathered from their blocks."""
        if self._masks is None:
            raise RuntimeError("PackedBatch.begin(seq_len) must precede attend()")
        cache = self.cache
        local = cache.local_layers is None or layer in cache.local_layers
        pools = (cache.k[layer], cache.v[layer])
        for pool, new in zip(pools, (k, v), strict=True):
            slots = pool.view(-1, new.shape[1] * new.shape[3])  # [blocks * bs, Hkv * Dh]
            rows = new[0].transpose(0, 1).reshape(-1, slots.shape[1])  # [T, Hkv * Dh]
            slots.index_copy_(0, self.write_slots, rows.to(slots.dtype))
        heads, dim, kv_heads = q.shape[1], q.shape[3], k.shape[1]
        group = heads // kv_heads
        out = []
        # once per forward, not per layer: folded for GQA and in the form the core adds
        form = _mask_form(core, q.dtype)
        if (group, form) not in self._folded:
            self._folded[group, form] = [_prepared_pair(pair, group, form) for pair in self._masks]
        folded = self._folded[group, form]
        in_place = (
            self.in_place
            and k.dtype == pools[0].dtype
            and getattr(core, "takes_additive_mask", False)  # plain softmax(q k^T) v
        )
        window = cache.sliding_window if local else None
        pieces = zip(self.pieces, folded, self._ends, strict=True)
        for (start, rows, n, table, end, _), masks, ends in pieces:
            if rows == 1 and end == n and k.dtype == pools[0].dtype:
                # a prompt's first chunk: its keys are this forward's, its mask the plain causal
                # one the core builds itself (SDPA's is_causal skips the masked half; no gather)
                span = slice(start, start + n)
                out.append(core(q[:, :, span], k[:, :, span], v[:, :, span])[0])
                continue
            if n == 1 and in_place:
                # one-token rows over their blocks in place: no gather, no padding, no mask
                piece_q = q[0, :, start : start + rows].transpose(0, 1)  # [rows, Hq, Dh]
                piece_q = piece_q.reshape(rows, kv_heads, group, dim)
                scale = core.scale if core.scale is not None else dim**-0.5
                piece = paged_attention.decode(piece_q, *pools, table, ends, scale, window)
                out.append(piece.reshape(rows, heads, -1).transpose(0, 1))
                continue
            index = table.reshape(-1)
            gathered = []
            for pool, buffer in zip(pools, cache.gather_buffers(index.numel()), strict=True):
                blocks = pool.view(pool.shape[0], -1)  # [blocks, bs * Hkv * Dh]
                kv = torch.index_select(blocks, 0, index, out=buffer)
                kv = kv.view(rows, -1, *pool.shape[2:])[:, :end]  # [rows, end, Hkv, Dh]
                gathered.append(kv.transpose(1, 2))
            # GQA folded into the query axis: the `group` query heads of one kv head attend as
            # group * n queries of an [rows, Hkv, ...] call, with no k/v repeated for them
            piece_q = q[0, :, start : start + rows * n].view(heads, rows, n, dim).transpose(0, 1)
            piece_q = piece_q.reshape(rows, kv_heads, group * n, dim)
            mask = masks[1] if local else masks[0]
            piece = core(piece_q, *gathered, mask=mask)  # [rows, Hkv, group * n, Dh]
            piece = piece.reshape(rows, heads, n, -1).transpose(0, 1)
            out.append(piece.reshape(heads, rows * n, -1))
        return torch.cat(out, dim=1)[None] if len(out) > 1 else out[0][None]

    def advance(self, seq_len: int) -> None:
        self._masks, self._folded = None, {}


def paged_attention_takes(cache) -> bool:
    """Whether the paged attention op handles `cache`'s heads, dtype and device (building it
    on the first call)."""
    k_pool, v_pool = cache.k[0], cache.v[0]
    return paged_attention.takes(k_pool.shape[3], v_pool.shape[3], k_pool.dtype, k_pool.device.type)


def _fold(mask: torch.Tensor | None, group: int) -> torch.Tensor | None:
    """[rows, 1, n, end] -> [rows, 1, group * n, end]: each query's mask for each of the
    `group` query heads folded into the query axis."""
    if group == 1 or mask is None:
        return mask
    rows, _, n, end = mask.shape
    return mask[:, :, None].expand(rows, 1, group, n, end).reshape(rows, 1, group * n, end)


def _mask_form(core, dtype: torch.dtype) -> tuple[str, torch.dtype] | None:
    """The float form of a mask `core` takes, which would otherwise be built from the bool one
    on every call: SDPA's additive mask, the batch-invariant attention's padded bias; None
    where the core takes the bool mask."""
    if getattr(core, "takes_additive_mask", False):
        return "additive", dtype
    if getattr(core, "backend", None) == "invariant":
        return "invariant", dtype
    return None


def _prepared_pair(
    pair: tuple[torch.Tensor | None, torch.Tensor | None],
    group: int,
    form: tuple[str, torch.dtype] | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A piece's (causal, windowed) masks folded for GQA and `_prepared`; one mask for both
    where they are one (no sliding window)."""
    causal, windowed = pair
    first = _prepared(_fold(causal, group), form)
    return first, first if windowed is causal else _prepared(_fold(windowed, group), form)


def _prepared(
    mask: torch.Tensor | None, form: tuple[str, torch.dtype] | None
) -> torch.Tensor | None:
    """A bool mask in `form` (`_mask_form`): for SDPA the float one it would turn it into on
    every call (0 where True, -inf where False), for the invariant attention its
    `invariant_bias`; as it is when `form` is None."""
    if form is None or mask is None:
        return mask
    kind, dtype = form
    if kind == "invariant":
        return invariant_bias(mask, dtype)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def _pieces(
    lengths: list[int], counts: list[int], *, bounded: bool = True
) -> list[tuple[int, int]]:
    """[lo, hi) row ranges: a row of several tokens alone; consecutive one-token rows together,
    when `bounded` (they are gathered) only while the run's longest context is at most
    DECODE_RUN_PADDING x the row's (so padding stays bounded; the engine orders decoding rows
    longest first) and the run gathers at most DECODE_RUN_KEYS key slots."""
    out: list[tuple[int, int]] = []
    lo = 0
    for row, count in enumerate(counts):
        if row == lo:
            continue
        fits = True
        if bounded:
            longest = max(lengths[lo:row]) + 1
            fits = longest <= DECODE_RUN_PADDING * (lengths[row] + 1)
            fits = fits and (row - lo + 1) * longest <= DECODE_RUN_KEYS
        joins = count == 1 and counts[lo] == 1 and fits
        if not joins:
            out.append((lo, row))
            lo = row
    out.append((lo, len(counts)))
    return out
