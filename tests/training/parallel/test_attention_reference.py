"""The model's attention core (GQA, MQA, sliding window) equals a naive softmax(QK^T)V reference."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.model.attention import AttentionCore


def naive_attention(q, k, v, window):
    """Repeat key/value heads, mask by position, softmax in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    S = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    visible = (j <= i) & ((i - j) < window if window else True)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize(
    "hq,hkv,window",
    [(4, 4, None), (4, 2, None), (4, 1, None), (4, 2, 3), (4, 1, 5), (2, 2, 64)],
    ids=["mha", "gqa", "mqa", "gqa-window", "mqa-window", "window-wider-than-seq"],
)
def test_attention_core_matches_naive(hq, hkv, window):
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    q, k, v = (torch.randn(2, h, 12, 8, generator=g, requires_grad=True) for h in (hq, hkv, hkv))
    out = AttentionCore(8, sliding_window=window, backend="sdpa")(q, k, v)
    ref = naive_attention(q, k, v, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    for got, want in zip(grads, ref_grads, strict=False):
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=0)
