"""Kiln's decode matmul op (kiln/model/decode_matmul.py) against the torch kernels it replaces,
at SmolLM2-135M's shapes, one torch thread.

    .venv/bin/python bench/decode_matmul.py                       # the kernels, ~1 min
    .venv/bin/python bench/decode_matmul.py --part engine --hf-dir HF   # whole engines, ~5 min

--part kernels: the 30 blocks' 210 linears (distinct weights, so each comes from memory as in
a decode step) at each row count; int8: the op against `_weight_int8pack_mm` (bf16 activations,
what int8 layers called before); fp32: the op against MKL's NN sgemm on the same column-major
weight. Medians over --rounds alternated passes, in ms per pass, and the ratio.

--part engine: SmolLM2 (HF export) in one process, the op switched on and off between runs of
the same engine. int8, one request (`--quantize int8`'s decoding at concurrency 1); fp32, eight
requests after a first pass has cached their prompts, so the runs are decode steps of 8 rows.
Printed: output tokens per CPU-second each way, their ratio and whether the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.model import decode_matmul  # noqa: E402

# SmolLM2-135M's block linears, (out, in): q, k, v, o, gate, up, down; 30 blocks
BLOCK = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
BLOCKS = 30


def _median_ms(passes: dict, rounds: int) -> dict[str, float]:
    times = {name: [] for name in passes}
    for _ in range(rounds):
        for name, run in passes.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def kernels(rows: list[int], rounds: int) -> None:
    torch.manual_seed(0)
    shapes = BLOCK * BLOCKS
    int8 = []
    fp32 = []
    for n, k in shapes:
        q = torch.randint(-128, 128, (n, k), dtype=torch.int8)
        scales = torch.rand(n) * 0.01
        int8.append((q, scales, scales.bfloat16()))
        fp32.append(torch.randn(k, n))
    print("rows | int8 op | torch int8pack | ratio | fp32 op | MKL NN sgemm | ratio")
    for m in rows:
        acts = {k: torch.randn(m, k) for k in (576, 1536)}

        def int8_op(acts=acts):
            for q, s, _ in int8:
                decode_matmul.int8_mm(acts[q.shape[1]], q, s)

        def int8_torch(acts=acts):
            for q, _, s in int8:
                torch.ops.aten._weight_int8pack_mm(acts[q.shape[1]].bfloat16(), q, s)

        def fp32_op(acts=acts):
            for w in fp32:
                decode_matmul.fp32_mm(acts[w.shape[0]], w)

        def fp32_mkl(acts=acts):
            for w in fp32:
                torch.mm(acts[w.shape[0]], w)

        t = _median_ms({"i8": int8_op, "i8t": int8_torch, "f": fp32_op, "fm": fp32_mkl}, rounds)
        print(
            f"{m} | {t['i8']:.1f} | {t['i8t']:.1f} | {t['i8t'] / t['i8']:.2f}x | "
            f"{t['f']:.1f} | {t['fm']:.1f} | {t['fm'] / t['f']:.2f}x",
            flush=True,
        )


def engine(hf_dir: str, rounds: int, max_tokens: int) -> None:
    from bench.engine_packed import prompts_of, run
    from kiln.engine.engine import Engine
    from kiln.engine.generator import Generator
    from kiln.model.quantize import Int8WeightOnlyLinear

    for label, quantize, requests in (("int8, 1 request", "int8", 1), ("fp32, 8 rows", None, 8)):
        gen = Generator.load(hf_dir, dtype=torch.float32, quantize=quantize)
        int8_layers = [m for m in gen.model.modules() if isinstance(m, Int8WeightOnlyLinear)]
        fp32_rows = decode_matmul.FP32_ROWS
        prompts = prompts_of(gen, requests)
        eng = Engine(gen, max_slots=32)
        run(eng, prompts, 1)  # prompts cached: the runs below are decode steps
        figures, tokens = {"op": [], "torch": []}, {}
        for _ in range(rounds):
            for side in figures:
                for layer in int8_layers:
                    layer.own_kernel = side == "op"
                decode_matmul.FP32_ROWS = fp32_rows if side == "op" else range(0)
                fig, tokens[side] = run(eng, prompts, max_tokens)
                figures[side].append(fig["tok_cpu"])
        decode_matmul.FP32_ROWS = fp32_rows
        op, ref = (statistics.median(figures[s]) for s in ("op", "torch"))
        print(
            f"{label}: op {op:.1f} tok/CPU-s, torch kernels {ref:.1f}, {op / ref:.2f}x; "
            f"greedy tokens {'identical' if tokens['op'] == tokens['torch'] else 'DIFFER'}",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("kernels", "engine"), default="kernels")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hf-dir", help="a SmolLM2 HF export (--part engine)")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not decode_matmul.available():
        raise SystemExit("the decode matmul op did not build here (see the warning above)")
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.part == "kernels":
        kernels([int(r) for r in args.rows.split(",")], args.rounds)
    else:
        if not args.hf_dir:
            raise SystemExit("--part engine needs --hf-dir")
        engine(args.hf_dir, max(1, args.rounds // 2), args.max_tokens)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
