"""Matmuls for decode-sized batches on CPU: a small C++ op
(csrc/decode_matmul.cpp, built on first use by native_ops). Decoding multiplies a few rows by
every weight once a step, so the weight's bytes set the pace, and the library kernels spend them
badly here: MKL's fp32 sgemm streams ~5 GB/s at 8 rows where one core reads 12-17, and torch's
int8 weight-only kernel (`_weight_int8pack_mm`, which also rounds activations to bf16) is no
faster than an fp32 GEMV on AVX2. Both ops accumulate fp32 activations in fp32:

* `int8_mm`: int8 weights [N, K] and a scale per output channel (`Int8WeightOnlyLinear`,
  `INT8_ROWS` rows, `INT8_ROWS_BESIDE_BF16` where bf16 units multiply more).
* `fp32_mm`: an fp32 weight held column-major, [K, N] (`cpu_linear.DecodeLinear`,
  `FP32_ROWS` rows; a single row stays with MKL's GEMV, which already streams at full speed).

`int8_mm_reference` and `fp32_mm_reference` are the ops' contracts in plain torch.
"""

from __future__ import annotations

import os

import torch

from kiln.model import native_ops

ENV = "KILN_DECODE_MATMUL"  # "torch": never build or use the op

# rows fp32_mm takes: 1.2-1.4x MKL's NN sgemm from 4 to 24 rows, level at 2 and at 32
# (SmolLM2-135M's 210 block linears, one thread, weights from memory: bench/decode_matmul.py)
FP32_ROWS = range(4, 33)
# rows int8_mm takes: 1.5-1.9x torch's int8 kernel at 1-32 rows, and from 17 to 32 rows ahead of
# the weight dequantized to fp32 (what more rows get, quantize.DEQUANTIZED_MIN_ROWS)
INT8_ROWS = range(1, 33)
# with bf16 units, up to where the layer's packed bf16 copy (oneDNN, twice the bytes) catches up:
# 1.2-1.7x it and 1.3x torch's int8 kernel at 1-4 rows, 0.9x at 8 (AVX-512-BF16, Zen 4)
INT8_ROWS_BESIDE_BF16 = range(1, 5)


def available() -> bool:
    """Whether the op is loaded (building it on first call; False, logged once, if it cannot)."""
    if os.environ.get(ENV, "").lower() == "torch":
        return False
    return native_ops.load("decode_matmul", "decode matmul op", "using torch's kernels")


def int8_mm(a: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """a [M, K] fp32, qweight [N, K] int8, scales [N] fp32 -> a @ (qweight * scales[:, None])^T,
    [M, N] fp32."""
    return torch.ops.kiln_decode.int8_mm(a.contiguous(), qweight, scales)


def fp32_mm(a: torch.Tensor, weight_kn: torch.Tensor) -> torch.Tensor:
    """a [M, K] fp32, weight_kn [K, N] fp32 contiguous -> a @ weight_kn, [M, N] fp32."""
    return torch.ops.kiln_decode.fp32_mm(a.contiguous(), weight_kn)


def int8_mm_reference(a, qweight, scales) -> torch.Tensor:
    return a.float() @ (qweight.float() * scales.float()[:, None]).t()


def fp32_mm_reference(a, weight_kn) -> torch.Tensor:
    return a.float() @ weight_kn.float()
