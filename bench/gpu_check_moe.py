"""gpu_check's MoE stage: one MoE layer forward+backward with experts on `torch._grouped_mm`
against the per-expert loop, same routing and weights: output/gradient agreement, both times,
and whether the grouped kernel was taken (it must be on a bf16 sm90+ GPU: H100/H200/B200).

    python bench/gpu_check_moe.py          # on the GPU: bf16 autocast, Mixtral-like widths
    python bench/gpu_check_moe.py --dry    # on CPU: small fp32 layer, the same checks

Prints one JSON object; exit 1 when the paths disagree or the GPU should but cannot group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shape(dry: bool) -> dict[str, int]:
    if dry:
        return {"tokens": 256, "dim": 64, "hidden": 128, "experts": 4, "top_k": 2}
    return {"tokens": 16384, "dim": 4096, "hidden": 7168, "experts": 8, "top_k": 2}


def _run(layer, x, dtype, grouped: bool, reps: int) -> tuple[float, Any, list]:
    """Mean seconds of forward+backward, the output and the expert weight gradients."""
    import torch

    from kiln.model import moe as moe_module

    def fn(w13, w2, h, counts, use_grouped=None):
        return original(w13, w2, h, counts, grouped)

    original = moe_module.grouped_swiglu
    moe_module.grouped_swiglu = fn
    device = x.device.type
    try:

        def once():
            layer.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                out = layer(x)
            out.float().pow(2).mean().backward()
            return out

        once()  # warm-up (kernel selection, allocator)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            out = once()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / reps
    finally:
        moe_module.grouped_swiglu = original
    grads = [p.grad.detach().clone() for p in layer.experts.parameters()]
    return seconds, out.detach().float(), grads


def check(dry: bool) -> dict[str, Any]:
    import torch

    from kiln.model.moe import MoE, grouped_mm_usable

    device = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    s = shape(dry)
    torch.manual_seed(0)
    layer = MoE(s["dim"], s["hidden"], s["experts"], s["top_k"]).to(device)
    x = torch.randn(1, s["tokens"], s["dim"], device=device)
    usable = grouped_mm_usable(device, dtype, s["dim"], s["hidden"])
    reps = 3 if dry else 10
    grouped_s, out_g, grads_g = _run(layer, x, dtype, usable, reps)
    loop_s, out_l, grads_l = _run(layer, x, dtype, False, reps)

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    out_err = rel(out_g, out_l)
    grad_err = max(rel(a.float(), b.float()) for a, b in zip(grads_g, grads_l, strict=True))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    needs_grouped = device.type == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
    result = {
        "device": "cpu" if dry else torch.cuda.get_device_name(),
        "dtype": str(dtype).removeprefix("torch."),
        **s,
        "grouped_mm": usable,
        "grouped_ms": round(grouped_s * 1e3, 2),
        "loop_ms": round(loop_s * 1e3, 2),
        "speedup": round(loop_s / grouped_s, 2),
        "out_rel_err": out_err,
        "grad_rel_err": grad_err,
        "tolerance": tol,
    }
    errors = []
    if out_err > tol or grad_err > tol:
        errors.append(f"grouped and loop disagree (out {out_err:.2e}, grads {grad_err:.2e})")
    if needs_grouped and not usable:
        errors.append("torch._grouped_mm not usable on this sm90+ GPU: experts fell to the loop")
    if errors:
        result["error"] = "; ".join(errors)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check_moe.py")
    parser.add_argument("--dry", action="store_true")
    result = check(parser.parse_args(argv).dry)
    print(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
