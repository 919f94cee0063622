"""Rank functions for the ring-attention tests (module level: worker processes import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kiln.training.parallel.ring import zigzag_shard
from kiln.training.parallel.ring_attention import ring_attention

# (global length, query heads, key/value heads, sliding window, zigzag)
CASES = [
    (16, 4, 4, None, True),
    (32, 4, 2, None, True),  # GQA
    (24, 4, 1, None, True),  # MQA
    (32, 4, 2, 5, True),  # sliding window smaller than a chunk
    (48, 2, 2, 20, True),  # window spanning chunks
    (32, 4, 2, None, False),  # contiguous sharding
    (32, 4, 2, 7, False),
]


def sdpa_reference(q, k, v, window):
    S = q.shape[2]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    mask = j <= i
    if window is not None:
        mask &= (i - j) < window
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


def _shard(x, rank, world, zigzag):
    return zigzag_shard(x, 2, rank, world) if zigzag else x.chunk(world, 2)[rank]


def ring_vs_sdpa(fused: bool | None = None) -> list[tuple]:
    """Max |ring - SDPA| of output and of dQ, dK, dV on this rank's rows, per case (`fused`:
    the ring's block kernel, default the device's)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    errors = []
    for seed, (S, Hq, Hkv, window, zigzag) in enumerate(CASES):
        if S % (2 * world):
            continue
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, h, S, 8, generator=g) for h in (Hq, Hkv, Hkv))
        dout = torch.randn(2, Hq, S, 8, generator=g)
        ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = sdpa_reference(*ref_inputs, window)
        ref.backward(dout)

        local = [_shard(t, rank, world, zigzag).requires_grad_() for t in (q, k, v)]
        out = ring_attention(
            *local, dist.group.WORLD, causal=True, window=window, zigzag=zigzag, fused=fused
        )
        out.backward(_shard(dout, rank, world, zigzag))
        diffs = [(out - _shard(ref.detach(), rank, world, zigzag)).abs().max().item()]
        diffs += [
            (t.grad - _shard(r.grad, rank, world, zigzag)).abs().max().item()
            for t, r in zip(local, ref_inputs, strict=False)
        ]
        errors.append(((S, Hq, Hkv, window, zigzag), max(diffs)))
    return errors
