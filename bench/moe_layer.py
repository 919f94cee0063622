"""MoE layer forward+backward on CPU: grouped GEMM (torch._grouped_mm) against the per-expert loop.

The loop is the layer's previous algorithm (one small GEMM per expert, counts read to the host);
both run the same routing and the same weights, in fp32 and under bf16 autocast.

    python bench/moe_layer.py [--tokens 4096] [--dim 512] [--hidden 1024] [--experts 8] [--top-k 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kiln.model import moe as moe_module  # noqa: E402


def step_seconds(layer: moe_module.MoE, x: torch.Tensor, dtype: torch.dtype, reps: int) -> float:
    def once() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            out = layer(x)
        out.float().pow(2).mean().backward()

    once()  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        once()
    return (time.perf_counter() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = moe_module.MoE(args.dim, args.hidden, args.experts, args.top_k)
    x = torch.randn(1, args.tokens, args.dim)
    grouped = moe_module.grouped_swiglu
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ours = step_seconds(layer, x, dtype, args.reps)
        moe_module.grouped_swiglu = lambda e, h, c, use_grouped=None: grouped(e, h, c, False)
        try:
            loop = step_seconds(layer, x, dtype, args.reps)
        finally:
            moe_module.grouped_swiglu = grouped
        print(
            f"{name}: grouped {ours * 1e3:.1f} ms  per-expert loop {loop * 1e3:.1f} ms  "
            f"speed-up {loop / ours:.2f}x  (fwd+bwd, {args.tokens} tokens, E={args.experts}, "
            f"top-{args.top_k}, D={args.dim}, H={args.hidden})"
        )


if __name__ == "__main__":
    main()
