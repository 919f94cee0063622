"""Batch-invariant arithmetic: each token's numbers the same however many other tokens share its
forward, so a KV-cache decode (one query per row, keys padded to the batch's longest) and one
full forward over the whole sequence give bit-identical fp32 logits on CPU.

Two things make the same row come out differently in fp32 (measured on MKL, AVX-512):
- a matmul with fewer than `MIN_GEMM_ROWS` rows runs MKL's small-matrix kernel, whose sums
  round differently from the blocked kernel every larger matmul uses; from 16 rows on, a row's
  result does not depend on the row count. Callers pad their rows up to it (`pad_rows`). (A
  plain 3-D bmm differs only at one row, but the attention's products, with a transposed
  operand, measured different below 16 rows too.)
- SDPA's fused CPU kernel blocks queries and keys by their counts, and a softmax over fewer
  keys than a vector's width takes a scalar exp. `invariant_attention` is plain
  matmuls (rows padded) and a softmax over keys padded (masked) to a multiple of `KEY_BLOCK`,
  so trailing masked keys add exact zeros and every kept key takes the same vectorized path.

It is what `attention_backend: invariant` runs; the RL loops switch it on (kiln/training/rl).
The cost is the [queries, keys] score matrix SDPA's kernel never materialises.

The linear layers need not pay the 16-row padding: a weight stored column-major (the [N, K]
values with strides (1, N), so `F.linear` runs MKL's "NN" sgemm on a contiguous [K, N] matrix)
gives every row the numbers the row-major weight's blocked kernel gives a batch of 16 or more,
from 2 rows on (one row takes the matrix-vector kernel). That is what a trainer's forward
computes, so a decoding engine whose linears are column-major pads only to
`column_major_exact_rows` (measured here per weight shape, once per process: 2 on MKL AVX-512
and AVX2) and runs its few rows 1.5-3x faster than padded to 16.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kiln.model.softcap import soft_cap

MIN_GEMM_ROWS = 16  # MKL's small-matrix kernel below this many rows (see above)
KEY_BLOCK = 16  # softmax width padding: 16 fp32 lanes (AVX-512), two AVX2 vectors


@functools.cache
def column_major_exact_rows(out_features: int, in_features: int, threads: int) -> int:
    """The fewest rows (2..MIN_GEMM_ROWS) from which `x @ W.T` with W [out, in] stored
    column-major equals, row for row, the row-major product over a batch of 2 * MIN_GEMM_ROWS
    rows (the trainer's); MIN_GEMM_ROWS when no smaller count does. Measured on random numbers
    (the kernel's summation order does not depend on them) under `threads` torch threads."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(out_features, in_features, generator=g)
    x = torch.randn(2 * MIN_GEMM_ROWS, in_features, generator=g)
    with torch.no_grad():
        reference = x @ weight.T
        weight = weight.T.contiguous().T  # the same values, column-major
        exact = MIN_GEMM_ROWS
        for rows in range(MIN_GEMM_ROWS - 1, 1, -1):
            if not torch.equal(F.linear(x[:rows], weight), reference[:rows]):
                break
            exact = rows
    return exact


def pad_rows(x: torch.Tensor, rows: int = MIN_GEMM_ROWS) -> torch.Tensor:
    """x [..., M, K] with zero rows appended up to `rows` (unchanged when M >= rows)."""
    missing = rows - x.shape[-2]
    if missing <= 0:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:-2], missing, x.shape[-1])], dim=-2)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with a's rows padded to the blocked kernel's range (the padding sliced off)."""
    if a.shape[-2] >= MIN_GEMM_ROWS:
        return a @ b
    return (pad_rows(a) @ b)[..., : a.shape[-2], :]


def invariant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v for q [B, Hq, S, Dh], k/v [B, Hkv, L, Dh] (GQA: Hq a multiple
    of Hkv, query head h reading key head h // (Hq / Hkv)). `mask` (bool, True = attend,
    broadcast to [B, 1, S, L]; or its `invariant_bias`) or, when None, causal with the queries
    the last S positions (and within `window` of each query)."""
    B, Hq, S, Dh = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    if mask is None:
        query = torch.arange(L - S, L, device=q.device)[:, None]
        key = torch.arange(L, device=q.device)[None, :]
        mask = key <= query
        if window is not None:
            mask &= query - key < window
        bias = _additive(mask, q.dtype)
    elif mask.dtype == torch.bool:
        bias = invariant_bias(mask, q.dtype)
    else:
        bias = mask
    # keys padded to the softmax's block (masked out): a full forward pads its keys and values
    # with zeros (the products come out padded, no copy of the score matrix); a decode, whose
    # few queries make the score matrix the smaller, pads that instead. Both give the same
    # numbers: trailing zero keys change neither product (tests/model/test_batch_invariance.py)
    width = -(-L // KEY_BLOCK) * KEY_BLOCK
    # fewer keys than a block: keys and values padded, never the scores. ATen's bmm runs its own
    # loop, not MKL, on products of contraction x rows x columns < 400: over 1-3 keys of 8-wide
    # heads (tiny models) the sliced scores would take it and round unlike the trainer's
    pad_scores = groups * S < 2 * Dh and L >= KEY_BLOCK
    if bias.shape[-1] != width:
        raise ValueError(f"a mask over {bias.shape[-1]} keys for {L} keys padded to {width}")
    if width != L and not pad_scores:
        k, v = (F.pad(t, (0, 0, 0, width - L)) for t in (k, v))
    # a key head's query heads side by side: one [groups * S, Dh] x [Dh, keys] matmul per key head
    scores = _matmul((q * scale).reshape(B, Hkv, groups * S, Dh), k.transpose(-1, -2))
    if pad_scores and width != L:
        scores = F.pad(scores, (0, width - L))
    scores = scores.view(B, Hkv, groups, S, width)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    probs = torch.softmax(scores + bias, dim=-1)
    probs = probs.view(B, Hkv, groups * S, width)
    if pad_scores:
        probs = probs[..., :L]
    out = _matmul(probs, v)
    return out.reshape(B, Hq, S, v.shape[-1])


def invariant_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask [B, 1, S, L] (True = attend) as `invariant_attention` adds it to its scores:
    [B, 1, 1, S, width] (every query head of a key head alike) of `dtype`, 0 where True and -inf
    where False or past L, the keys padded up to `width`, a multiple of KEY_BLOCK. A caller
    attending many times with one mask (every layer of a decode step) builds it once and passes
    it as the mask: the same numbers, without a mask's padding and conversion per call."""
    return _additive(mask.unsqueeze(2), dtype)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`mask` [..., L] padded (False) to KEY_BLOCK-wide keys, then as a float table to add to
    the scores: added, not masked_fill'ed, the same values (x + 0 = x, x - inf = -inf), and
    adding the mask's small [.., S, keys] table is ~4x faster than a broadcast masked_fill on
    CPU."""
    keys = mask.shape[-1]
    width = -(-keys // KEY_BLOCK) * KEY_BLOCK
    if width != keys:
        mask = F.pad(mask, (0, width - keys), value=False)
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf"))
