"""Multi-LoRA serving: one engine decoding requests of several adapters in shared forwards,
against the same requests served one adapter at a time by engines on each adapter's merged
weights (what serving adapters costs without multi-LoRA: a model per adapter, each batch only
its own requests).

    .venv/bin/python bench/serving_lora.py                           # ~2-4 min on 2 loaded cores
    .venv/bin/python bench/serving_lora.py --layers 2 --requests 8   # a smoke run

A SmolLM2-135M-shaped model with random weights (`--layers` of its 30), `--adapters` PEFT
adapters of rank `--rank` on every linear layer (random A/B, written and read back as PEFT
folders, as `kiln sft` writes them), `--requests` prompts of 32-128 tokens, the adapters taken
in turn, `--new` greedy tokens each. Sides, alternated `--rounds` times, medians printed:
  multi-LoRA   one engine (`max_loras` = the adapters), every request submitted at once;
  merged       one engine per adapter on its merged weights, each serving its adapter's
               requests at once, the adapters one after the other (the usual alternative);
  base only    the base model serving every request at once: no adapter work (what the LoRA
               matmuls cost, as a ceiling).
Printed: output tokens/s and tokens per CPU-second (process time: steadier than wall time on a
shared machine) per side, the multi-LoRA / merged and multi-LoRA / base ratios, and how
many requests' greedy tokens agree between multi-LoRA and merged (fp32 rounds x W + x A B and
x (W + A B) differently, so a near-tie can flip on random weights).
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.optimizer_cpu import SMOLLM2_135M  # noqa: E402
from kiln.engine import Engine  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.model import ModelConfig, Transformer  # noqa: E402
from kiln.model.formats.peft import export_peft_adapter  # noqa: E402
from kiln.model.lora import LoRAConfig, LoRALinear, apply_lora, merged_state_dict  # noqa: E402


def make_adapters(base: Transformer, k: int, rank: int, root: str) -> list[Transformer]:
    """Write `k` PEFT folders under root (adapter-0 ...); returns each one's merged model."""
    cfg = LoRAConfig(rank=rank, alpha=2 * rank)
    merged_models = []
    for i in range(k):
        adapted = copy.deepcopy(base)
        apply_lora(adapted, cfg)
        g = torch.Generator().manual_seed(i + 1)
        with torch.no_grad():
            for m in adapted.modules():
                if isinstance(m, LoRALinear):
                    m.lora_a.copy_(torch.randn(m.lora_a.shape, generator=g) * 0.02)
                    m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * 0.02)
        state = adapted.state_dict()
        export_peft_adapter(state, cfg, os.path.join(root, f"adapter-{i}"))
        merged = copy.deepcopy(base)
        merged.load_state_dict(merged_state_dict(state, cfg.scaling))
        merged_models.append(merged.eval())
        del adapted
    return merged_models


def run_engine(engine: Engine, jobs: list[tuple[list[int], str | None]], new: int) -> list:
    """Submit every job at once, step until all finish on this thread: [wall seconds, CPU
    seconds, each job's tokens]."""
    params = SamplingParams(max_new_tokens=new, temperature=0.0)
    start, cpu = time.perf_counter(), time.process_time()
    requests = [engine.submit(ids, params, lambda e: None, lora=lora) for ids, lora in jobs]
    for _ in engine.run(requests):
        pass
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    for r in requests:
        assert r.error is None, r.error
    return [wall, cpu, [r.seq.token_ids for r in requests]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", type=int, default=4, help="2-4 adapters")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--slots", type=int, default=16, help="sequences running at once")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ModelConfig(**{**SMOLLM2_135M, "n_layers": args.layers, "max_seq_len": 512})
    torch.manual_seed(0)
    base = Transformer(cfg).eval()
    rng = random.Random(0)
    names = [f"adapter-{i % args.adapters}" for i in range(args.requests)]
    prompts = [
        [rng.randrange(cfg.vocab_size) for _ in range(rng.randint(32, 128))]
        for _ in range(args.requests)
    ]
    jobs = list(zip(prompts, names, strict=True))
    with tempfile.TemporaryDirectory() as root:
        merged = make_adapters(base, args.adapters, args.rank, root)
        multi = Engine(Generator(base, None, eos_token_ids=[]), max_slots=args.slots,
                       max_loras=args.adapters, max_lora_rank=args.rank)  # fmt: skip
        for i in range(args.adapters):
            multi.loras.add(f"adapter-{i}", os.path.join(root, f"adapter-{i}"))
        per_adapter = [
            Engine(Generator(m, None, eos_token_ids=[]), max_slots=args.slots) for m in merged
        ]
        plain = Engine(Generator(copy.deepcopy(base), None, eos_token_ids=[]), max_slots=args.slots)

        def one_at_a_time():
            wall, cpu, tokens = 0.0, 0.0, [None] * len(jobs)
            for i, engine in enumerate(per_adapter):
                mine = [j for j, (_, name) in enumerate(jobs) if name == f"adapter-{i}"]
                w, c, out = run_engine(engine, [(jobs[j][0], None) for j in mine], args.new)
                wall, cpu = wall + w, cpu + c
                for j, t in zip(mine, out, strict=True):
                    tokens[j] = t
            return [wall, cpu, tokens]

        sides = {
            "multi-LoRA": lambda: run_engine(multi, jobs, args.new),
            "merged": one_at_a_time,
            "base only": lambda: run_engine(plain, [(p, None) for p in prompts], args.new),
        }
        run_engine(multi, jobs[:2], 2)  # warm torch's kernels
        runs = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, side in sides.items():
                multi.reset_prefix_cache()  # every round computes its prompts again
                for engine in [*per_adapter, plain]:
                    engine.reset_prefix_cache()
                runs[name].append(side())
    total = args.requests * args.new
    tok_s = {name: statistics.median(total / w for w, _, _ in rs) for name, rs in runs.items()}
    tok_cpu = {name: statistics.median(total / c for _, c, _ in rs) for name, rs in runs.items()}
    multi_tokens, merged_tokens = runs["multi-LoRA"][0][2], runs["merged"][0][2]
    agree = sum(a == b for a, b in zip(multi_tokens, merged_tokens, strict=True))
    print(
        f"multi-LoRA: {args.requests} requests over {args.adapters} rank-{args.rank} adapters "
        f"(all linear layers), prompts 32-128 tokens, {args.new} greedy new tokens, "
        f"{args.slots} slots, SmolLM2-135M shape with {args.layers} layers, "
        f"{torch.get_num_threads()} threads, median of {args.rounds} rounds"
    )
    for name, value in tok_s.items():
        print(f"  {name:12} {value:9.1f} output tok/s {tok_cpu[name]:9.1f} tok per CPU-second")
    for label, figures in (("tok/s", tok_s), ("tok per CPU-second", tok_cpu)):
        print(
            f"  {label}: multi-LoRA / merged one adapter at a time "
            f"{figures['multi-LoRA'] / figures['merged']:.2f}x, multi-LoRA / base only "
            f"{figures['multi-LoRA'] / figures['base only']:.2f}x"
        )
    print(f"  greedy tokens equal to the merged engines': {agree}/{args.requests} requests")
    print(
        f"  slot loads {multi.loras.slots.loads}, mixed forwards {multi.loras.slots.mixed_forwards}"
    )


if __name__ == "__main__":
    main()
