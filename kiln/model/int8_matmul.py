"""Weight-only int8 matmul for a few rows: a small C++ op (csrc/int8_matmul.cpp, built on first
use by native_ops) for CPUs without bf16 matrix units, where torch's `_weight_int8pack_mm` is no
faster than an fp32 GEMV: decoding reads every weight once per step, and this op reads int8
where fp32 reads four bytes, widening each weight in registers against unrounded fp32
activations (torch's kernel rounds them to bf16 first). `Int8WeightOnlyLinear` sends decode-sized
batches here (quantize.py); `mm_reference` is the op's contract in plain torch.
"""

from __future__ import annotations

import os

import torch

from kiln.model import native_ops

ENV = "KILN_INT8_MATMUL"  # "torch": never build or use the op


def available() -> bool:
    """Whether the op is loaded (building it on first call; False, logged once, if it cannot)."""
    if os.environ.get(ENV, "").lower() == "torch":
        return False
    return native_ops.load("int8_matmul", "int8 matmul op", "using torch's int8 kernel")


def mm(a: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """a [M, K] fp32, qweight [N, K] int8, scales [N] fp32 -> a @ (qweight * scales[:, None])^T,
    [M, N] fp32, accumulated in fp32."""
    return torch.ops.kiln_int8.mm(a.contiguous(), qweight, scales)


def mm_reference(a: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`mm` in plain torch: the op's definition for tests."""
    return a.float() @ (qweight.float() * scales.float()[:, None]).t()
