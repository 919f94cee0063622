"""Automatic prefix caching on a shared-prefix workload, and what paging costs a decode step.

    .venv/bin/python bench/prefix_cache.py                 # both parts, ~2-4 min on 2 loaded cores
    .venv/bin/python bench/prefix_cache.py --part workload --requests 8 --layers 8   # a smoke run

1. workload: `--requests` prompts that share a `--prefix`-token system prompt, each with its own
   8-24-token tail and `--new` greedy tokens, submitted at once to kiln's engine (up to
   `--slots` running), on a SmolLM2-135M-shaped model with random weights (`--layers` of them),
   once with prefix caching on and once off, alternating `--rounds` times. Printed per side:
   output tokens/s, TTFT p50/p99 (submit to first token), the prefix-cache hit rate, and the
   on/off ratios; the two sides' greedy tokens are checked identical.
2. decode: one decode step of `--rows` rows at `--context` cached tokens through the paged cache
   (each row's blocks gathered through its block table, blocks scattered over the pool) against
   the contiguous per-row `KVCache` the engine used before paging (the same forward, the same
   model). Median wall ms of 5 steps and the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.optimizer_cpu import SMOLLM2_135M  # noqa: E402
from bench.serving import pct  # noqa: E402
from kiln.engine import Engine  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.model import KVCache, ModelConfig, Transformer  # noqa: E402
from kiln.model.paged_kv_cache import PagedKVCache  # noqa: E402


def make_generator(layers: int) -> Generator:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**SMOLLM2_135M, "n_layers": layers})).eval()
    return Generator(model, tokenizer=None, eos_token_ids=[])


def prompts(n: int, prefix: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    system = [rng.randrange(vocab) for _ in range(prefix)]
    return [system + [rng.randrange(vocab) for _ in range(rng.randint(8, 24))] for _ in range(n)]


def run_workload(gen: Generator, jobs: list[list[int]], args, caching: bool) -> dict:
    engine = Engine(gen, max_slots=args.slots, enable_prefix_caching=caching).start()
    params = SamplingParams(max_new_tokens=args.new)
    first: dict[int, float] = {}
    finals: dict[int, list[int]] = {}
    done = threading.Event()

    def listener(i: int):
        def hear(event) -> None:
            first.setdefault(i, time.perf_counter())
            if event.kind != "token":
                finals[i] = event.token_ids
                if len(finals) == len(jobs):
                    done.set()

        return hear

    try:
        start = time.perf_counter()
        for i, ids in enumerate(jobs):
            engine.submit(ids, params, listener(i))
        assert done.wait(3600), "the workload did not finish"
        wall = time.perf_counter() - start
        stats = engine.stats()
    finally:
        engine.stop()
    ttft = [first[i] - start for i in range(len(jobs))]
    return {
        "tok_s": sum(len(t) for t in finals.values()) / wall,
        "ttft_p50": pct(ttft, 50),
        "ttft_p99": pct(ttft, 99),
        "hit_rate": stats["prefix_cache_hit_rate"],
        "tokens": [finals[i] for i in range(len(jobs))],
    }


def workload(args) -> None:
    gen = make_generator(args.layers)
    jobs = prompts(args.requests, args.prefix, SMOLLM2_135M["vocab_size"])
    runs: dict[bool, list[dict]] = {True: [], False: []}
    run_workload(gen, jobs[:2], args, True)  # warm torch's kernels
    for _ in range(args.rounds):
        for caching in (False, True):
            runs[caching].append(run_workload(gen, jobs, args, caching))
    assert all(r["tokens"] == runs[False][0]["tokens"] for r in runs[True] + runs[False])
    med = {
        c: {k: statistics.median(r[k] for r in rs) for k in ("tok_s", "ttft_p50", "ttft_p99")}
        for c, rs in runs.items()
    }
    print(
        f"shared-prefix workload: {args.requests} requests, a {args.prefix}-token shared prefix "
        f"+ 8-24 own tokens, {args.new} new tokens, {args.slots} slots, {args.layers} layers, "
        f"{torch.get_num_threads()} threads, median of {args.rounds} rounds; greedy tokens "
        "identical on and off"
    )
    print(f"  hit rate with caching: {runs[True][0]['hit_rate']:.3f}")
    for key, label, better in (
        ("tok_s", "output tokens/s", "on/off"),
        ("ttft_p50", "TTFT p50 s", "off/on"),
        ("ttft_p99", "TTFT p99 s", "off/on"),
    ):
        on, off = med[True][key], med[False][key]
        ratio = on / off if better == "on/off" else off / on
        print(f"  {label:16} caching on {on:9.3f}   off {off:9.3f}   {better} {ratio:5.2f}x")


def decode_step(args) -> None:
    cfg = ModelConfig(**{**SMOLLM2_135M, "n_layers": args.layers})
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    rows, context, bs = args.rows, args.context, 16
    per_row = -(-(context + 1) // bs)
    paged = PagedKVCache.for_model(cfg, rows * per_row + 1, bs)
    order = torch.randperm(rows * per_row) + 1  # every row's blocks scattered over the pool
    tables = order.view(rows, per_row).tolist()
    contiguous = KVCache.for_model(cfg, rows, context + 1)
    tokens = torch.randint(0, cfg.vocab_size, (rows, 1))
    index = (torch.arange(rows), torch.zeros(rows, dtype=torch.long))

    def paged_step():
        model(tokens, kv_cache=paged.batch(tables, [context] * rows, 1), logits_positions=index)

    def contiguous_step():
        contiguous.lengths = torch.full((rows,), context)
        model(tokens, kv_cache=contiguous, logits_positions=index)

    times: dict[str, list[float]] = {"paged": [], "contiguous": []}
    with torch.inference_mode():
        for _ in range(6):  # alternate; the first round warms up
            for name, fn in (("paged", paged_step), ("contiguous", contiguous_step)):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    p, c = (statistics.median(times[k][1:]) * 1e3 for k in ("paged", "contiguous"))
    print(
        f"one decode step, {rows} rows x {context} cached tokens, {args.layers} layers, "
        f"{torch.get_num_threads()} threads (median of 5):"
    )
    print(
        f"  paged (block gather) {p:8.1f} ms   contiguous rows {c:8.1f} ms   paged/contiguous "
        f"{p / c:5.2f}x"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["workload", "decode", "all"], default="all")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.part in ("workload", "all"):
        workload(args)
    if args.part in ("decode", "all"):
        decode_step(args)


if __name__ == "__main__":
    main()
