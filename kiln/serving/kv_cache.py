"""A static key/value cache and the cached forward pass of kiln's `Transformer`.

The model file knows nothing of serving: this forward reuses the model's own submodules
(`tok_embeddings`, per block `attention_norm`, `attention.wq/wk/wv/wo`, `ffn_norm`,
`feed_forward` or `moe`, then `norm`, `output`) and its RoPE tables, and does attention itself
over the cached keys and values with an explicit mask: causal, sliding window, left padding.

Batches are left-padded: row b's prompt starts at slot `pad[b]`, so every row's next token lands
in the same slot and one decode step is one [B, 1] forward. RoPE positions are `slot - pad[b]`,
so a padded row computes exactly what it would alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KVCache:
    """Per-layer key/value buffers [B, Hkv, capacity, Dh] filled left to right."""

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        pad: torch.Tensor,
        sliding_window: int | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.pad = pad.to(device)  # [B] leading pad slots per row
        self.window = sliding_window
        self.capacity = capacity
        self.length = 0  # slots filled so far

    @property
    def batch(self) -> int:
        return self.pad.shape[0]

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's k/v [B, Hkv, S, Dh] after the filled slots; return all filled k/v."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"KV cache is full ({self.capacity} slots)")
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def positions(self, n: int) -> torch.Tensor:
        """RoPE positions [B, n] of the next n slots (pad slots clamp to 0; they are never read)."""
        slots = torch.arange(self.length, self.length + n, device=self.pad.device)
        return (slots[None, :] - self.pad[:, None]).clamp(min=0)

    def mask(self, n: int) -> torch.Tensor:
        """Boolean attention mask [B, 1, n, length+n] for the next n query slots (True = attend)."""
        q = torch.arange(self.length, self.length + n, device=self.pad.device)[:, None]
        k = torch.arange(self.length + n, device=self.pad.device)[None, :]
        allowed = (k <= q)[None] & (k[None] >= self.pad[:, None, None])
        if self.window is not None:
            allowed &= (q - k < self.window)[None]
        # a pad query sees only itself, so its softmax is finite (its output is never used)
        allowed |= (k == q)[None] & (q[None] < self.pad[:, None, None])
        return allowed[:, None]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished sequences from the batch (rows: indices to keep)."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.pad = self.pad.index_select(0, rows)


def model_shape(model: nn.Module) -> tuple[int, int, int, int]:
    """(n_layers, n_heads, n_kv_heads, head_dim) read from the weights themselves."""
    head_dim = model.rope_cos.shape[-1]
    first = next(iter(model.layers.values())).attention
    return (
        len(model.layers),
        first.wq.out_features // head_dim,
        first.wk.out_features // head_dim,
        head_dim,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF Llama's rotate_half RoPE; x [B, H, S, Dh], cos/sin [B, 1, S, Dh]."""
    return x * cos + _rotate_half(x) * sin


@torch.no_grad()
def forward_with_cache(
    model: nn.Module, tokens: torch.Tensor, cache: KVCache, last_only: bool = True
) -> torch.Tensor:
    """Run `tokens` [B, S] through the model, reading and extending `cache`.

    Returns logits for the last position [B, V] (or all positions [B, S, V] with last_only=False).
    """
    bsz, seqlen = tokens.shape
    _, n_heads, n_kv_heads, head_dim = model_shape(model)
    positions = cache.positions(seqlen)
    mask = cache.mask(seqlen)
    h = model.tok_embeddings(tokens)
    cos = model.rope_cos[positions].to(h.dtype)[:, None]
    sin = model.rope_sin[positions].to(h.dtype)[:, None]
    for index, layer in enumerate(model.layers.values()):
        attn = layer.attention
        x = layer.attention_norm(h)
        q = attn.wq(x).view(bsz, seqlen, n_heads, head_dim).transpose(1, 2)
        k = attn.wk(x).view(bsz, seqlen, n_kv_heads, head_dim).transpose(1, 2)
        v = attn.wv(x).view(bsz, seqlen, n_kv_heads, head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        k_all, v_all = cache.update(index, k, v)
        out = F.scaled_dot_product_attention(
            q, k_all, v_all, attn_mask=mask, enable_gqa=n_kv_heads != n_heads
        )
        h = h + attn.wo(out.transpose(1, 2).reshape(bsz, seqlen, n_heads * head_dim))
        x = layer.ffn_norm(h)
        moe = getattr(layer, "moe", None)
        h = h + (moe(x) if moe is not None else layer.feed_forward(x))
    cache.advance(seqlen)
    if last_only:
        h = h[:, -1]
    return model.output(model.norm(h))
