"""Attention that never crosses documents in a packed row (SDPA with a block-diagonal mask).

`enable_document_masking(model)` wraps each layer's attention core once; `document_masking(model,
document_ids)` then sets, for one forward/backward, which document each position belongs to.
A query attends a key when both are in the same document, the key is not later, and (Mistral)
within the sliding window. With RoPE positions restarting per document (the batch's
`positions`), each document's logits equal those of the document alone in a row.

Context parallelism swaps the core for ring attention, which knows no document mask: packed
data with `cp > 1` is refused where the layout is chosen. On GPU with flash-attn installed (and
half precision) the varlen kernel runs over the documents' boundaries (`cu_seqlens`) with no
S x S mask; the SDPA path is the reference used everywhere else.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.attention import backend_available


def varlen_boundaries(document_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32 [N + 1], longest run) of the runs of equal document id in each row of
    [B, S] ids, flattened row after row: flash-attn's varlen layout of a packed batch (padding
    runs are sequences of their own; their labels are ignored)."""
    B, S = document_ids.shape
    flat = document_ids.reshape(-1)
    start = torch.ones_like(flat, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1]
    start[::S] = True  # a row never continues the previous row's document
    starts = start.nonzero().flatten()
    cu = torch.cat([starts, starts.new_tensor([B * S])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def flash_varlen_usable(q: torch.Tensor) -> bool:
    """flash-attn's varlen kernel: CUDA, half precision and the package installed."""

    return (
        q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and backend_available("flash_attn")
    )


class _DocumentState:
    """The current batch's document layout, shared by every layer's wrapped core: the SDPA mask
    and flash-attn's varlen boundaries, each built on first use."""

    def __init__(self, sliding_window: int | None) -> None:
        self.sliding_window = sliding_window
        self.document_ids: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._varlen: tuple[torch.Tensor, int] | None = None

    def set(self, document_ids: torch.Tensor | None) -> None:
        self.document_ids, self._mask, self._varlen = document_ids, None, None

    @property
    def mask(self) -> torch.Tensor | None:
        """Boolean [B, 1, S, S]: same document, key not later, within the window."""
        ids = self.document_ids
        if ids is None or self._mask is not None:
            return self._mask
        S = ids.shape[-1]
        i = torch.arange(S, device=ids.device)
        allowed = i[None, :] <= i[:, None]
        if self.sliding_window is not None:
            allowed &= (i[:, None] - i[None, :]) < self.sliding_window
        same = ids[:, :, None] == ids[:, None, :]
        self._mask = (same & allowed)[:, None]
        return self._mask

    @property
    def varlen(self) -> tuple[torch.Tensor, int]:
        if self._varlen is None:
            self._varlen = varlen_boundaries(self.document_ids)
        return self._varlen


def flash_varlen_attention(q, k, v, cu_seqlens, max_seqlen, sliding_window=None):
    """q [B, Hq, S, Dh], k/v [B, Hkv, S, Dh] -> [B, Hq, S, Dh] with attention inside each
    varlen sequence only (flash-attn's kernel: no S x S mask)."""
    from flash_attn import flash_attn_varlen_func

    B, _, S, _ = q.shape

    def tokens_major(t):
        return t.transpose(1, 2).reshape(B * S, t.shape[1], t.shape[3])

    window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
    out = flash_attn_varlen_func(
        tokens_major(q), tokens_major(k), tokens_major(v), cu_seqlens, cu_seqlens,
        max_seqlen, max_seqlen, causal=True, window_size=window,
    )  # fmt: skip
    return out.reshape(B, S, q.shape[1], q.shape[3]).transpose(1, 2)


class DocumentMaskedCore(nn.Module):
    """The wrapped core when no document ids are set; otherwise attention inside documents:
    flash-attn varlen on GPU where installed, block-diagonal causal SDPA elsewhere."""

    def __init__(self, inner: nn.Module, state: _DocumentState) -> None:
        super().__init__()
        self.inner = inner
        self.state = state

    def forward(self, q, k, v, mask=None):
        if self.state.document_ids is None or mask is not None:
            return self.inner(q, k, v) if mask is None else self.inner(q, k, v, mask=mask)
        if flash_varlen_usable(q) and q.shape[2] == k.shape[2]:
            cu_seqlens, longest = self.state.varlen
            return flash_varlen_attention(q, k, v, cu_seqlens, longest, self.state.sliding_window)
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.state.mask, enable_gqa=gqa)


def enable_document_masking(model: nn.Module) -> _DocumentState:
    """Wrap every attention core of `model` (idempotent); returns the shared state."""
    existing = getattr(model, "_kiln_document_state", None)
    if existing is not None:
        return existing
    state = _DocumentState(getattr(getattr(model, "cfg", None), "sliding_window", None))
    for module in list(model.modules()):
        core = getattr(module, "core", None)
        if core is not None and not isinstance(core, DocumentMaskedCore):
            module.core = DocumentMaskedCore(core, state)
    model._kiln_document_state = state
    return state


@contextlib.contextmanager
def document_masking(model: nn.Module, document_ids: torch.Tensor | None):
    """Within the block, attention in `model` stays inside each document of `document_ids`."""
    state = enable_document_masking(model)
    state.set(document_ids)
    try:
        yield
    finally:
        state.set(None)
