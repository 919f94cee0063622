"""Rotary position embedding, Hugging Face Llama convention (rotate_half on two halves).

Using HF's layout means exported q/k weights need no permutation. Llama-3's frequency scaling
(`rope_scaling: {rope_type: llama3, ...}`) is applied to the inverse frequencies as HF does;
YaRN's (`rope_type: yarn`) is kiln/model/yarn.py, its attention factor scales the tables.
"""

from __future__ import annotations

import math

import torch

from kiln.model.rope_scaling import RopeScaling
from kiln.model.yarn import attention_factor, yarn_inverse_frequencies


def inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None = None, device=None
) -> torch.Tensor:
    """[head_dim / 2] rotation frequencies, with Llama-3 or YaRN scaling when `scaling` is set."""
    if scaling is not None and scaling.rope_type == "yarn":
        return yarn_inverse_frequencies(head_dim, theta, scaling, device)
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    if scaling is None:
        return inv_freq
    # Llama 3.1: long wavelengths slow down by `factor`, short ones stay, the band between blends.
    old_len = scaling.original_max_seq_len
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    head_dim: int,
    max_seq_len: int,
    theta: float,
    device=None,
    scaling: RopeScaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape [max_seq_len, head_dim]."""
    inv_freq = inverse_frequencies(head_dim, theta, scaling, device)
    positions = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    if scaling is not None and scaling.rope_type == "yarn":
        factor = attention_factor(scaling)
        return emb.cos() * factor, emb.sin() * factor
    return emb.cos(), emb.sin()


def rope_rows(
    cos: torch.Tensor, sin: torch.Tensor, seq_len: int, positions: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The table rows for a sequence: the first `seq_len` ([S, Dh]) when `positions` is None,
    else the rows of `positions` [S] -> [S, Dh] or [B, S] -> [B, 1, S, Dh] (per-row positions)."""
    if positions is None:
        return cos[:seq_len], sin[:seq_len]
    cos, sin = cos[positions], sin[positions]
    if positions.dim() == 2:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return cos, sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, Dh] rotated by cos/sin rows (from `rope_rows`) for x's positions."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin
