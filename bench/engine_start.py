"""A serving engine's start and first answer on a SmolLM2-135M-shaped model (the quickstart's,
an 8192-token context): KV-cache blocks zeroed as they are first used (kiln's paged cache)
against the whole block pool zeroed at start (enough blocks for every slot's full context).
Prints the seconds to build the engine and answer one short request, the CPU seconds (user +
system) that took, the KV-cache bytes touched after it, and the ratios.

    .venv/bin/python bench/engine_start.py [--slots 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import threading
import time

import optimizer_cpu
import torch

from kiln.engine import Engine
from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model import ModelConfig, Transformer

# the quickstart model's shape (bench/ is on sys.path when a bench runs), with its real context
SMOLLM2_135M = {**optimizer_cpu.SMOLLM2_135M, "max_seq_len": 8192}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_and_answer(gen: Generator, max_slots: int, zero_all: bool) -> dict:
    done = threading.Event()
    wall, cpu = time.perf_counter(), cpu_s()
    engine = Engine(gen, max_slots=max_slots)
    cache = engine.kv.cache
    if zero_all:
        cache.zero_through(cache.num_blocks - 1)
    engine.start()
    try:
        engine.submit(
            list(range(1, 33)),
            SamplingParams(max_new_tokens=8),
            lambda event: event.kind != "token" and done.set(),
        )
        assert done.wait(300), "no answer"
        result = {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_s() - cpu}
        per_block = sum(t[0].numel() * t.element_size() for t in cache.k + cache.v)
        result["kv_gb"] = cache.zeroed * per_block / 1e9
    finally:
        engine.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=8, help="the local backend's max_batch_size")
    ap.add_argument("--threads", type=int, default=1, help="a Serve replica on 1 CPU has 1")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SMOLLM2_135M))
    gen = Generator(model, tokenizer=None, eos_token_ids=[])
    start_and_answer(gen, args.slots, False)  # warm torch's kernels for both
    ours = start_and_answer(gen, args.slots, False)
    theirs = start_and_answer(gen, args.slots, True)
    print(f"engine start + first answer, {args.slots} slots, {args.threads} thread(s):")
    for name, key in (("wall s", "wall_s"), ("CPU s", "cpu_s"), ("KV cache GB", "kv_gb")):
        ratio = theirs[key] / ours[key]
        print(
            f"  {name:12} zeroed on use {ours[key]:7.3f}   zeroed at start {theirs[key]:7.3f}"
            f"   ratio {ratio:6.1f}x"
        )


if __name__ == "__main__":
    main()
