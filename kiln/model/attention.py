"""The attention core: softmax(q k^T) v with causal + sliding-window masking, GQA and optional
score scale and soft-capping.

It is its own module so parallelisms can swap it (context parallelism puts ring attention here)
and recompute can target it (selective activation checkpointing).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.batch_invariance import invariant_attention
from kiln.model.softcap import soft_cap
from kiln.platform.errors import ConfigError

BACKENDS = ("auto", "sdpa", "flash_attn", "te", "invariant")


def backend_available(name: str) -> bool:
    """Whether an attention backend can run here (package importable and, for kernels, CUDA)."""
    if name in ("auto", "sdpa", "invariant"):
        return True
    package = {"flash_attn": "flash_attn", "te": "transformer_engine"}[name]
    return torch.cuda.is_available() and importlib.util.find_spec(package) is not None


def set_attention_backend(model: nn.Module, backend: str) -> None:
    """Every attention core of `model` switched to `backend`, and `model.cfg` says so (a copy
    or a rebuild from the config gets the same)."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"model.attention_backend {backend!r} is unknown; expected one of {BACKENDS}"
        )
    for module in model.modules():
        if isinstance(module, AttentionCore):
            module.backend = backend
    if getattr(model, "cfg", None) is not None:
        model.cfg = model.cfg.model_copy(update={"attention_backend": backend})


def sliding_window_mask(seq_len: int, window: int | None, device=None) -> torch.Tensor:
    """Boolean [S, S] mask, True where query i may attend key j: j <= i and i - j < window."""
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask &= (i - j) < window
    return mask


class AttentionCore(nn.Module):
    """Causal attention over q [B, Hq, Sq, Dh] and k/v [B, Hkv, Sk, Dh] -> [B, Hq, Sq, Dh]."""

    def __init__(
        self,
        head_dim: int,
        sliding_window: int | None = None,
        backend: str = "auto",
        *,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        """`scale` multiplies q k^T (None: head_dim**-0.5); `softcap` caps the scaled scores
        with cap * tanh(s / cap) before the softmax (no fused kernel does: plain matmuls)."""
        super().__init__()
        if backend not in BACKENDS:
            raise ConfigError(
                f"model.attention_backend {backend!r} is unknown; expected one of {BACKENDS}"
            )
        if not backend_available(backend):
            raise ConfigError(
                f"model.attention_backend={backend!r} needs CUDA and the "
                f"{'flash-attn' if backend == 'flash_attn' else 'transformer-engine'} package "
                "(pip install 'kiln[gpu]'); use 'sdpa' or 'auto' here"
            )
        self.head_dim = head_dim
        self.sliding_window = sliding_window
        self.backend = backend
        self.scale = scale
        self.softcap = softcap
        self._te_attention = None  # built on first use: TE wants the (TP-local) head counts

    @property
    def takes_additive_mask(self) -> bool:
        """Whether `forward` may be given a float mask (0 = attend, -inf = not) instead of a
        bool one: SDPA turns a bool mask into exactly that on every call, so a caller that
        attends many times with one mask converts it once."""
        return self.backend in ("auto", "sdpa") and self.softcap is None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`mask` (bool, True = attend, broadcast to [B, Hq, Sq, Sk]; additive where
        `takes_additive_mask`) replaces the causal and window masks: decoding from a KV cache,
        where queries and keys are not the same slots."""
        if self.backend == "invariant":  # a decode and a full forward agree bit for bit
            scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
            return invariant_attention(
                q, k, v, mask, scale=scale, softcap=self.softcap, window=self.sliding_window
            )
        if self.softcap is not None:
            return self._softcapped(q, k, v, mask)
        if mask is not None:
            return self._sdpa(q, k, v, mask)
        backend = self.backend
        if backend == "auto":
            # SDPA reaches FlashAttention-2/cuDNN for plain causal masks; with a window it needs
            # an explicit mask, so the flash-attn package (if present) is faster there.
            use_flash = (
                self.sliding_window is not None
                and q.is_cuda
                and q.dtype in (torch.float16, torch.bfloat16)
                and backend_available("flash_attn")
            )
            backend = "flash_attn" if use_flash else "sdpa"
        if backend == "flash_attn":
            return self._flash(q, k, v)
        if backend == "te":
            return self._te(q, k, v)
        return self._sdpa(q, k, v)

    def _sdpa(self, q, k, v, mask=None):
        gqa = q.shape[1] != k.shape[1]
        plain_causal = self.sliding_window is None or self.sliding_window >= q.shape[2]
        if mask is None and not plain_causal:
            mask = sliding_window_mask(q.shape[2], self.sliding_window, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa, scale=self.scale
        )

    def _softcapped(self, q, k, v, mask=None):
        if mask is None:
            mask = sliding_window_mask(q.shape[2], self.sliding_window, q.device)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scale = self.scale if self.scale is not None else self.head_dim**-0.5
        scores = soft_cap(q @ k.transpose(-2, -1) * scale, self.softcap)
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

    def _flash(self, q, k, v):
        from flash_attn import flash_attn_func

        window = (-1, -1) if self.sliding_window is None else (self.sliding_window - 1, 0)
        out = flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            causal=True,
            window_size=window,
            softmax_scale=self.scale,
        )
        return out.transpose(1, 2)

    def _te(self, q, k, v):
        import transformer_engine.pytorch as te

        B, Hq, S, Dh = q.shape
        if self._te_attention is None:
            window = None if self.sliding_window is None else (self.sliding_window - 1, 0)
            self._te_attention = te.DotProductAttention(
                num_attention_heads=Hq,
                kv_channels=Dh,
                num_gqa_groups=k.shape[1],
                attn_mask_type="causal",
                window_size=window,
                qkv_format="bshd",
                softmax_scale=self.scale,
            )
        out = self._te_attention(
            q.transpose(1, 2).contiguous(),
            k.transpose(1, 2).contiguous(),
            v.transpose(1, 2).contiguous(),
        )
        return out.view(B, S, Hq, Dh).transpose(1, 2)
