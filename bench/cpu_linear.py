"""fp32 linear layouts on CPU at SmolLM2-135M's shapes: the plain row-major `F.linear` (today's
layers before `pack_for_cpu`) against the same weight column-major (the block linears now) and
a oneDNN-reordered copy (`mkldnn._linear_pointwise`, the LM head now; vLLM-CPU's `onednn_mm`).

    .venv/bin/python bench/cpu_linear.py                   # ~2 min on 2 busy cores
    .venv/bin/python bench/cpu_linear.py --rows 1,8,32 --shapes head

One torch thread; the three layouts alternate, --rounds times, on the same input; printed per
shape and row count: the median microseconds of each, the ratios to the plain layout, the
largest difference from it, and the load average at the start and end of the shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

# SmolLM2-135M: dim 576, 9 heads / 3 kv heads of 64, ffn 1536, vocabulary 49152
SHAPES = {
    "wqkv": (960, 576),
    "wo": (576, 576),
    "w13": (3072, 576),
    "w2": (576, 1536),
    "head": (49152, 576),
}


def per_call_us(fn, seconds: float) -> float:
    fn()
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        reps += 1
    return elapsed / reps * 1e6


def layouts_of(x, weight, column_major, packed) -> dict:
    """name -> a call computing x @ weight.T through that layout."""
    return {
        "plain": lambda: F.linear(x, weight),
        "column-major": lambda: F.linear(x, column_major),
        "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", default="1,4,8,16,32,64,256")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.05, help="per layout, per round")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("shape rows | plain us | column-major us (x) | oneDNN packed us (x) | max diff | load")
    for shape in args.shapes.split(","):
        n, k = SHAPES[shape]
        weight = torch.randn(n, k) / k**0.5
        column_major = weight.t().contiguous().t()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            layouts = layouts_of(x, weight, column_major, packed)
            load = os.getloadavg()[0]
            times = {name: [] for name in layouts}
            for _ in range(args.rounds):
                for name, fn in layouts.items():
                    times[name].append(per_call_us(fn, args.seconds))
            med = {name: statistics.median(t) for name, t in times.items()}
            ref = layouts["plain"]()
            diff = max((fn() - ref).abs().max().item() for fn in layouts.values())
            print(
                f"{shape} {rows} | {med['plain']:.0f} | {med['column-major']:.0f} "
                f"({med['plain'] / med['column-major']:.2f}x) | {med['packed']:.0f} "
                f"({med['plain'] / med['packed']:.2f}x) | {diff:.1e} | "
                f"{load:.1f}-{os.getloadavg()[0]:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
