"""The engine's cached forward: the LM head only where a token is sampled, fused projections.

`Transformer.forward` returns logits for every position; a prefill chunk needs them at its last
prompt position only, and a decode step only for the rows that decode. On a 125M-shaped model
with a 32k vocabulary the head is ~20% of a token's FLOPs (transformers' generate keeps one
position too: `logits_to_keep=1`).

`EngineForward` runs kiln's own Transformer with fewer ops per layer and the same values:
RoPE table rows gathered once per step (not once per layer) and applied in four ops instead of
six, RMSNorm as torch's fused op (bit-identical in float32), and a wide LM head stored
column-major (`_column_major_head`). Fused [q|k|v] and [gate|up] projections (vLLM's
QKVParallelLinear / MergedColumnParallelLinear) were measured and left out: on this 2-core AVX2
machine MKL ran them 5-30% slower than the separate matmuls at 8-200 rows (125M shape), and
equal at dim 256. A model of another layout (LoRA wrappers, pipeline stages, a subclass) runs
`logits_at` over its own modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.kv_cache import KVCache
from kiln.model.norms import RMSNorm
from kiln.model.transformer import Attention, FeedForward, Transformer, TransformerBlock


def logits_at(
    model: nn.Module,
    tokens: torch.Tensor,
    cache: KVCache,
    rows: list[int],
    cols: list[int],
) -> torch.Tensor:
    """`model(tokens, kv_cache=cache)[rows, cols]` ([len(rows), V]) without computing the
    other positions' logits. The trunk is `Transformer.forward`'s own loop; a model without
    that layout (no `layers`/`norm`/`output`) runs its whole forward instead."""
    parts = ("tok_embeddings", "layers", "norm", "output", "rope_cos", "rope_sin")
    if not all(getattr(model, p, None) is not None for p in parts):
        return model(tokens, kv_cache=cache)[rows, cols]
    h = model.tok_embeddings(tokens)
    seq_len = h.shape[1]
    positions = cache.positions(seq_len)
    cache.begin(seq_len)
    for layer in model.layers.values():
        h = layer(h, model.rope_cos, model.rope_sin, positions=positions, kv_cache=cache)
    cache.advance(seq_len)
    index = tuple(torch.tensor(i, dtype=torch.long, device=h.device) for i in (rows, cols))
    return model.output(model.norm(h[index]))


def _norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm as one op: torch's fused `rms_norm` gives the module's float32 result bit for
    bit in fewer, cheaper ops; other dtypes keep the module's float32-then-cast order."""
    if x.dtype != torch.float32:
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


WIDE_HEAD = 16384  # vocabularies from here on get the column-major head


def _column_major_head(model: Transformer) -> None:
    """Store a wide, untied LM head column-major (same values, same tensor size): F.linear then
    multiplies by a contiguous [D, V] matrix, which MKL runs 20-45% faster than the [V, D]
    transposed one at 1-64 rows (32000 x 768 head, 2 AVX2 cores); bit-identical from 2 rows
    up. A tied head keeps its layout (the embedding gathers rows of it)."""
    head = model.output
    if head.weight is model.tok_embeddings.weight or head.weight.shape[0] < WIDE_HEAD:
        return
    head.weight.data = head.weight.detach().t().contiguous().t()


def _plain(model: nn.Module) -> bool:
    """Exactly kiln's Transformer with its own block, attention and feed-forward classes."""
    if type(model) is not Transformer or model.tok_embeddings is None or model.output is None:
        return False
    for block in model.layers.values():
        if type(block) is not TransformerBlock or type(block.attention) is not Attention:
            return False
        linears = [getattr(block.attention, n) for n in ("wq", "wk", "wv", "wo")]
        if not block.moe_enabled:
            if type(block.feed_forward) is not FeedForward:
                return False
            linears += [getattr(block.feed_forward, n) for n in ("w1", "w2", "w3")]
        if any(type(lin) is not nn.Linear for lin in linears):
            return False
    return True


class EngineForward:
    """`logits_at` with fewer ops per layer, built once from a model (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.plain = _plain(model)
        if self.plain:
            _column_major_head(model)  # type: ignore[arg-type]

    def __call__(
        self, tokens: torch.Tensor, cache: KVCache, rows: list[int], cols: list[int]
    ) -> torch.Tensor:
        """`model(tokens, kv_cache=cache)[rows, cols]`: logits [len(rows), V] of those
        positions; every token's keys/values are cached and the rows advance."""
        model = self.model
        if not self.plain:
            return logits_at(model, tokens, cache, rows, cols)
        B, S = tokens.shape
        cfg = model.cfg
        Dh, Hq, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        h = model.tok_embeddings(tokens)
        positions = cache.positions(S)  # [B, S]
        cache.begin(S)
        # RoPE rows of this step [B, S, 1, Dh], gathered once for every layer; rotate_half(x) *
        # sin as (x's halves swapped) * (sin, its first half negated): the same values
        half = Dh // 2
        cos = model.rope_cos[positions].unsqueeze(2).to(h.dtype)
        sin = model.rope_sin[positions].unsqueeze(2).to(h.dtype)
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

        def rope(x: torch.Tensor) -> torch.Tensor:  # [B, S, H, Dh] -> [B, H, S, Dh]
            swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
            return (x * cos + swapped * sin).transpose(1, 2)

        gqa = Hq != Hkv
        for index, block in enumerate(model.layers.values()):
            att = block.attention
            x = _norm(block.attention_norm, h)
            q = rope(F.linear(x, att.wq.weight, att.wq.bias).view(B, S, Hq, Dh))
            k = rope(F.linear(x, att.wk.weight, att.wk.bias).view(B, S, Hkv, Dh))
            v = F.linear(x, att.wv.weight, att.wv.bias).view(B, S, Hkv, Dh).transpose(1, 2)
            k, v, mask = cache.update(index, k, v)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            h = h + F.linear(out.transpose(1, 2).reshape(B, S, Hq * Dh), att.wo.weight)
            x = _norm(block.ffn_norm, h)
            if block.moe_enabled:
                h = h + block.moe(x)
            else:
                ffn = block.feed_forward
                gate = F.silu(F.linear(x, ffn.w1.weight))
                h = h + F.linear(gate * F.linear(x, ffn.w3.weight), ffn.w2.weight)
        cache.advance(S)
        index = tuple(torch.tensor(i, dtype=torch.long, device=h.device) for i in (rows, cols))
        return model.output(_norm(model.norm, h[index]))
