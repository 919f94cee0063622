"""MoE layer forward+backward on CPU: 3-D expert weights against the stacked layout and a loop.

Three expert paths under the same routing and weights, in fp32 and under bf16 autocast:
  3-D        kiln's layer: weights live as [E, ., .] parameters (gate and up rows in one),
             two grouped GEMMs use them as they are
  stacked    the previous layout: one [H, D] weight per expert, stacked (and gate/up
             concatenated) into [E, ., .] on every forward, then two grouped GEMMs
  loop       one small GEMM per expert (counts read to the host)
The speed-ups printed are stacked / 3-D and loop / 3-D from this one run.

    python bench/moe_layer.py [--tokens 4096] [--dim 512] [--hidden 1024] [--experts 8] [--top-k 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kiln.model import moe as moe_module  # noqa: E402


class StackedExperts(torch.nn.Module):
    """The previous layout: per-expert [H, D] weights, stacked and cast on every forward."""

    def __init__(self, grouped: moe_module.GroupedExperts):
        super().__init__()
        gate, up = grouped.w13.detach().chunk(2, dim=1)
        self.w1, self.w3, self.w2 = (
            torch.nn.ParameterList(w.clone() for w in weight) for weight in (gate, up, grouped.w2)
        )

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        dtype = moe_module.compute_dtype(x)
        x = x.to(dtype)
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        w13 = torch.stack([torch.cat([a, b]) for a, b in zip(self.w1, self.w3, strict=True)])
        w2 = torch.stack(list(self.w2)).to(dtype)
        gate, up = torch._grouped_mm(x, w13.to(dtype).transpose(1, 2), offs=offsets).chunk(2, -1)
        h = (F.silu(gate) * up).contiguous()
        return torch._grouped_mm(h, w2.transpose(1, 2), offs=offsets)


class LoopExperts(torch.nn.Module):
    def __init__(self, grouped: moe_module.GroupedExperts):
        super().__init__()
        self.grouped = grouped

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        g = self.grouped
        return moe_module.grouped_swiglu(g.w13, g.w2, x, counts, use_grouped=False)


def step_seconds(layer: moe_module.MoE, x: torch.Tensor, dtype: torch.dtype, reps: int) -> float:
    def once() -> None:
        layer.zero_grad(set_to_none=True)
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
    parser.add_argument("--rounds", type=int, default=3, help="A/B/C rounds; medians reported")
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = moe_module.MoE(args.dim, args.hidden, args.experts, args.top_k)
    grouped = layer.experts
    paths = {"3-D": grouped, "stacked": StackedExperts(grouped), "loop": LoopExperts(grouped)}
    x = torch.randn(1, args.tokens, args.dim)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        times: dict[str, list[float]] = {path: [] for path in paths}
        for _ in range(args.rounds):  # interleaved, so machine load hits every path alike
            for path, experts in paths.items():
                layer.experts = experts
                times[path].append(step_seconds(layer, x, dtype, args.reps))
        layer.experts = grouped
        ms = {path: sorted(t)[len(t) // 2] * 1e3 for path, t in times.items()}
        print(
            f"{name}: 3-D {ms['3-D']:.1f} ms  stacked (before) {ms['stacked']:.1f} ms  "
            f"loop {ms['loop']:.1f} ms  speed-up vs stacked {ms['stacked'] / ms['3-D']:.2f}x  "
            f"vs loop {ms['loop'] / ms['3-D']:.2f}x  (fwd+bwd, {args.tokens} tokens, "
            f"E={args.experts}, top-{args.top_k}, D={args.dim}, H={args.hidden})"
        )


if __name__ == "__main__":
    main()
