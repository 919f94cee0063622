"""flash-attn's varlen layout of a packed batch: attention over the cu_seqlens runs equals the
block-diagonal causal SDPA mask (emulated per run on CPU; the real kernel on CUDA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.training.post.packed_attention import (
    _DocumentState,
    flash_varlen_usable,
    varlen_boundaries,
)

# two rows: documents 0,1 then padding (-1); documents 2 (whole row) ... and a row-crossing id
DOCS = torch.tensor([[0, 0, 0, 1, 1, -1, -1, -1], [1, 1, 1, 1, 2, 2, 2, 2]])


def _qkv(dtype=torch.float32, device="cpu", hq=4, hkv=2):
    g = torch.Generator().manual_seed(0)
    B, S, D = DOCS.shape[0], DOCS.shape[1], 8
    q = torch.randn(B, hq, S, D, generator=g)
    k, v = (torch.randn(B, hkv, S, D, generator=g) for _ in range(2))
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def _masked(q, k, v, ids, window=None):
    state = _DocumentState(window)
    state.set(ids)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=state.mask, enable_gqa=True)


def test_varlen_boundaries_split_rows_and_documents():
    cu, longest = varlen_boundaries(DOCS)
    # row 1 starts a new sequence although its first id (1) equals row 0's document 1
    assert cu.tolist() == [0, 3, 5, 8, 12, 16] and cu.dtype == torch.int32 and longest == 4


def test_attention_per_varlen_run_equals_the_document_mask():
    q, k, v = _qkv()
    want = _masked(q, k, v, DOCS)
    cu, _ = varlen_boundaries(DOCS)
    B, H, S, D = q.shape
    flat = [t.transpose(1, 2).reshape(B * S, t.shape[1], D) for t in (q, k, v)]
    out = torch.empty(B * S, H, D)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in flat)  # [H, L, D]
        out[a:b] = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, enable_gqa=True
        ).transpose(0, 1)
    got = out.reshape(B, S, H, D).transpose(1, 2)
    real = (DOCS >= 0)[:, None, :, None]  # padding rows attend among themselves: not compared
    torch.testing.assert_close(got * real, want * real, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [None, 3])
def test_flash_varlen_kernel_equals_the_document_mask(window):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, k, v = _qkv(torch.bfloat16, "cuda")
    if not flash_varlen_usable(q):
        pytest.skip("flash-attn is not installed")
    from kiln.training.post.packed_attention import flash_varlen_attention

    ids = DOCS.cuda()
    cu, longest = varlen_boundaries(ids)
    got = flash_varlen_attention(q, k, v, cu, longest, window)
    want = _masked(q.float(), k.float(), v.float(), ids, window)
    real = (ids >= 0)[:, None, :, None]
    torch.testing.assert_close(got.float() * real, want * real, rtol=0, atol=2e-2)
