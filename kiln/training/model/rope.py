"""Rotary position embedding, Hugging Face Llama convention (rotate_half on two halves).

Using HF's layout means exported q/k weights need no permutation.
"""

from __future__ import annotations

import torch


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape [max_seq_len, head_dim]."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    positions = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, Dh] rotated by cos/sin [S, Dh] (the rows for x's positions)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
