"""YaRN RoPE scaling (DeepSeek-V3's long context), computed as transformers computes it.

Three parts: inverse frequencies that interpolate the slow dims by `factor`, extrapolate the
fast ones and blend a ramp between (beta_fast / beta_slow rotations); an attention factor that
multiplies the cos/sin tables; and, for MLA only, mscale(factor, mscale_all_dim)**2 on the
softmax scale (the reference DeepSeek code scales q k^T, rotary and non-rotary dims alike).
"""

from __future__ import annotations

import math

import torch

from kiln.model.rope_scaling import RopeScaling


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's Eq. 21: 0.1 * mscale * ln(factor) + 1 (1 when the context is not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(scaling: RopeScaling) -> float:
    """The cos/sin multiplier: explicit, else mscale / mscale_all_dim, else mscale(factor)."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        num = yarn_mscale(scaling.factor, scaling.mscale)
        return num / yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return yarn_mscale(scaling.factor)


def softmax_mscale(scaling: RopeScaling | None) -> float:
    """MLA's extra softmax-scale factor: mscale(factor, mscale_all_dim)**2 (1 without YaRN)."""
    if scaling is None or scaling.rope_type != "yarn" or not scaling.mscale_all_dim:
        return 1.0
    return yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2


def _correction_dim(rotations: float, dim: int, base: float, max_len: int) -> float:
    """The dim index whose wavelength makes `rotations` turns over `max_len` positions."""
    return (dim * math.log(max_len / (rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling, device=None
) -> torch.Tensor:
    """[head_dim / 2] frequencies: extrapolated above beta_fast rotations, interpolated by
    `factor` below beta_slow, linearly blended between."""
    pos_freqs = theta ** (
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    old_len = scaling.original_max_seq_len
    low = _correction_dim(scaling.beta_fast, head_dim, theta, old_len)
    high = _correction_dim(scaling.beta_slow, head_dim, theta, old_len)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = (torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)
    keep = 1 - ramp.clamp(0, 1)  # 1: extrapolate (fast dims), 0: interpolate (slow dims)
    return interpolated * (1 - keep) + extrapolated * keep
