"""Attention that never crosses documents in a packed row (SDPA with a block-diagonal mask).

`enable_document_masking(model)` wraps each layer's attention core once; `document_masking(model,
document_ids)` then sets, for one forward/backward, which document each position belongs to.
A query attends a key when both are in the same document, the key is not later, and (Mistral)
within the sliding window. With RoPE positions restarting per document (the batch's
`positions`), each document's logits equal those of the document alone in a row.

Context parallelism swaps the core for ring attention, which knows no document mask: packed
data with `cp > 1` is refused where the layout is chosen. On GPU, flash-attn's varlen kernel
would avoid the S x S mask; this SDPA path is the reference used on CPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


class _DocumentState:
    """The current batch's attention mask, shared by every layer's wrapped core."""

    def __init__(self, sliding_window: int | None) -> None:
        self.sliding_window = sliding_window
        self.mask: torch.Tensor | None = None

    def set(self, document_ids: torch.Tensor | None) -> None:
        if document_ids is None:
            self.mask = None
            return
        S = document_ids.shape[-1]
        i = torch.arange(S, device=document_ids.device)
        allowed = i[None, :] <= i[:, None]
        if self.sliding_window is not None:
            allowed &= (i[:, None] - i[None, :]) < self.sliding_window
        same = document_ids[:, :, None] == document_ids[:, None, :]
        self.mask = (same & allowed)[:, None]  # [B, 1, S, S]


class DocumentMaskedCore(nn.Module):
    """The wrapped core when no document ids are set; block-diagonal causal SDPA when they are."""

    def __init__(self, inner: nn.Module, state: _DocumentState) -> None:
        super().__init__()
        self.inner = inner
        self.state = state

    def forward(self, q, k, v, mask=None):
        if self.state.mask is None or mask is not None:
            return self.inner(q, k, v) if mask is None else self.inner(q, k, v, mask=mask)
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
