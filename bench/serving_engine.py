"""Continuous batching vs request batching, and kiln's engine vs `transformers.generate`.

    .venv/bin/python bench/serving_engine.py           # ~3-6 min on 2 loaded CPU cores
    .venv/bin/python bench/serving_engine.py --quick   # smaller counts, a smoke run
    .venv/bin/python bench/serving_engine.py --part generation   # only section 2
    .venv/bin/python bench/serving_engine.py --part steps        # only section 3 (~10 s)

1. The local REST backend (in-process, no Ray) under 16 and 64 concurrent clients, vLLM
   `benchmark_serving` style: requests arrive as a Poisson process (--rate per client-count per
   second), at most C in flight, prompts of 8..200 words and outputs of 8..128 tokens, greedy.
   the continuous engine (streams) against the request batcher (bench/batch_baseline.py: a
   MicroBatcher of static `Generator.generate` batches; non-streamed, so its first token reaches
   the client with the whole completion) at the same max batch size C.
   Printed: output tokens/s, TTFT p50/p99, inter-token latency p50/p99, the process CPU seconds
   of each run (the shared machine's load moves wall time far more), the ratios, and the
   arrival-bound ceiling: output tokens / time of the last arrival, the tokens/s of a server that
   answered every request the instant it arrived (at 1 req/s per client, 64 clients x 4: ~4,100).
2. Generated tokens/s of the engine against `transformers.generate` (greedy, exactly
   --gen-tokens new tokens) at batch 1 and 8 on a 125M-shaped Llama (dim 768, 12 layers, vocab
   32000, random weights), loaded by transformers from kiln's HF export.
3. (--part steps only) what one 200-token prefill and one 64-row decode step of section 1's model
   cost on one thread, in thread CPU time, and the attention / matmul share of each; the decode
   step through the engine's paged KV cache (rows' blocks scattered over the pool, gathered per
   layer) and through contiguous per-row `KVCache` rows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.serving import CORPUS, make_model, pct  # noqa: E402

WORDS = " ".join(CORPUS).split()


def workload(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 200))) for _ in range(n)]
    return [(p, rng.randint(8, 128)) for p in prompts]


async def one_request(backend, prompt: str, max_tokens: int, streamed: bool) -> dict:
    from kiln.engine.sampler import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens)
    job = await backend.prepare(prompt, params, truncate=None, fit_context=False)
    start = time.perf_counter()
    if not streamed:
        (result,) = await backend.complete([job])
        ttft = time.perf_counter() - start
        return {"ttft": ttft, "gaps": [], "tokens": result.completion_tokens}
    stamps = []
    async for _ in backend.stream(job):
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return {"ttft": stamps[0] - start, "gaps": gaps, "tokens": max_tokens}


async def drive(backend, requests, clients: int, rate: float, streamed: bool, seed: int) -> dict:
    """Poisson arrivals at `rate` requests/s, at most `clients` in flight."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(clients)

    async def client(prompt, max_tokens):
        async with gate:
            return await one_request(backend, prompt, max_tokens, streamed)

    tasks, start, cpu = [], time.perf_counter(), cpu_seconds()
    for prompt, max_tokens in requests:
        tasks.append(asyncio.create_task(client(prompt, max_tokens)))
        last_arrival = time.perf_counter() - start
        await asyncio.sleep(rng.expovariate(rate))
    outs = await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    ttft = [o["ttft"] for o in outs]
    gaps = [g for o in outs for g in o["gaps"]]
    return {
        "tok_s": sum(o["tokens"] for o in outs) / wall,
        # what a server that answered every request the moment it arrived would reach: the
        # arrival schedule, not the server, bounds tokens/s at or near this figure
        "ceiling": sum(o["tokens"] for o in outs) / last_arrival,
        "cpu_s": cpu_seconds() - cpu,
        "ttft": (pct(ttft, 50), pct(ttft, 99)),
        "itl": (pct(gaps, 50), pct(gaps, 99)) if gaps else None,
    }


def serving_comparison(model_dir: str, counts: list[int], per_client: int, rate: float) -> None:
    from bench.batch_baseline import BatchBackend
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend

    print(f"\n1. REST local backend, Poisson arrivals at {rate:g} x C req/s, greedy")
    head = (
        f"{'C':>3} {'engine':<11} {'out tok/s':>9} {'TTFT p50/p99 s':>16} {'ITL p50/p99 ms':>16}"
        f" {'CPU s':>6} {'load':>5}"
    )
    print(head)
    for clients in counts:
        requests = workload(per_client * clients, seed=clients)
        res = {}
        for engine in ("continuous", "batch"):
            if engine == "continuous":
                backend = LocalBackend(model_dir, "bench", BatchingConfig(max_batch_size=clients))
            else:
                backend = BatchBackend(model_dir, "bench", clients, wait_s=0.01)
            r = asyncio.run(
                drive(backend, requests, clients, rate * clients, engine == "continuous", 0)
            )
            asyncio.run(backend.close())
            res[engine] = r
            itl = (
                f"{r['itl'][0] * 1e3:7.1f}/{r['itl'][1] * 1e3:<7.1f}" if r["itl"] else "n/a (whole)"
            )
            ttft = f"{r['ttft'][0]:7.2f}/{r['ttft'][1]:<7.2f}"
            print(
                f"{clients:>3} {engine:<11} {r['tok_s']:>9.1f} {ttft:>16} {itl:>16}"
                f" {r['cpu_s']:>6.1f} {os.getloadavg()[0]:>5.1f}",
                flush=True,
            )
        c, b = res["continuous"], res["batch"]
        print(
            f"{clients:>3} ratio       {c['tok_s'] / b['tok_s']:>8.2f}x "
            f"TTFT p99 continuous/batch {c['ttft'][1] / b['ttft'][1]:.2f}, "
            f"CPU s continuous/batch {c['cpu_s'] / b['cpu_s']:.2f}",
            flush=True,
        )
        print(
            f"{clients:>3} arrival-bound ceiling {c['ceiling']:.0f} tok/s "
            f"({c['ceiling'] / b['tok_s']:.2f}x the batcher): output tokens / last arrival time",
            flush=True,
        )


def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads): the work a run did, which the
    shared machine's load changes less than the wall time."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def generation_comparison(tmp: str, new_tokens: int, prompt_len: int, repeats: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from kiln.engine import Engine
    from kiln.engine.generator import Generator
    from kiln.engine.sampler import SamplingParams
    from kiln.model.config import ModelConfig
    from kiln.model.transformer import Transformer
    from kiln.serving.export.hf import export_hf
    from tests.engine.tiny import train_tokenizer

    cfg = ModelConfig(
        vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=12,
        ffn_hidden_dim=2048, max_seq_len=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    gen = Generator(Transformer(cfg).eval(), train_tokenizer(), eos_token_ids=[])
    n_params = sum(p.numel() for p in gen.model.parameters()) / 1e6
    export_hf(gen, os.path.join(tmp, "hf125m"))
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(tmp, "hf125m")).eval()
    print(f"\n2. generation, {n_params:.0f}M params, prompt {prompt_len}, {new_tokens} new tokens")
    print(f"{'batch':>5} {'kiln engine tok/s':>18} {'transformers tok/s':>19} {'ratio':>6}")
    rng = random.Random(0)
    for batch in (1, 8):
        prompts = [[rng.randrange(cfg.vocab_size) for _ in range(prompt_len)] for _ in range(batch)]
        engine = Engine(gen, max_slots=batch, prefill_chunk=512).start()
        params = SamplingParams(max_new_tokens=new_tokens)

        def ours(engine=engine, prompts=prompts, params=params):
            finished = threading.Semaphore(0)
            ends = []

            def listener(event):
                if event.kind != "token":
                    ends.append(event)
                    finished.release()

            for p in prompts:
                engine.submit(p, params, listener)
            for _ in prompts:
                finished.acquire()
            assert all(len(e.token_ids) == new_tokens for e in ends)

        def theirs(prompts=prompts):
            with torch.inference_mode():
                out = hf.generate(
                    torch.tensor(prompts), attention_mask=torch.ones(len(prompts), prompt_len,
                    dtype=torch.long), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                    do_sample=False, pad_token_id=0,
                )  # fmt: skip
            assert out.shape[1] == prompt_len + new_tokens

        best, cpu = [float("inf"), float("inf")], [float("inf"), float("inf")]
        ours(), theirs()  # warm-up
        for _ in range(repeats):  # interleaved, best of each: the shared machine's load varies
            for k, fn in enumerate((ours, theirs)):
                t, c = time.perf_counter(), cpu_seconds()
                fn()
                best[k] = min(best[k], time.perf_counter() - t)
                cpu[k] = min(cpu[k], cpu_seconds() - c)
        rates = [batch * new_tokens / b for b in best]
        engine.stop()
        print(
            f"{batch:>5} {rates[0]:>18.1f} {rates[1]:>19.1f} {rates[0] / rates[1]:>5.2f}x"
            f"   CPU s/run {cpu[0]:.2f} vs {cpu[1]:.2f} (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )


def step_costs(repeats: int) -> None:
    """One prefill and one full decode step of the serving model on one thread, in this
    thread's CPU time (what the shared machine's load moves least), with the op split."""
    import torch
    from torch.profiler import profile

    from kiln.engine.model_runner import ModelRunner
    from kiln.model.config import ModelConfig
    from kiln.model.kv_cache import KVCache
    from kiln.model.paged_kv_cache import PagedKVCache
    from kiln.model.transformer import Transformer

    torch.set_num_threads(1)
    cfg = ModelConfig(
        vocab_size=347,
        dim=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden_dim=640,
        max_seq_len=1024,
    )  # fmt: skip  (make_model's shape and vocabulary)
    torch.manual_seed(0)
    forward = ModelRunner(Transformer(cfg).eval())
    rows, bs = 64, 16
    lengths = torch.randint(20, 330, (rows,)).tolist()  # the 64-client run's spread
    # the engine's paged cache: each row's blocks scattered over the pool
    paged = PagedKVCache.for_model(cfg, rows * 21 + 16, bs)
    order = (torch.randperm(rows * 21) + 1).view(rows, 21).tolist()
    tables = [order[r][: n // bs + 1] for r, n in enumerate(lengths)]
    contiguous = KVCache.for_model(cfg, rows, 1024)  # the per-row layout before paging
    step = torch.randint(0, cfg.vocab_size, (rows, 1))
    prompt = torch.randint(0, cfg.vocab_size, (1, 200))

    def decode():
        forward(step, paged.batch(tables, lengths, 1), list(range(rows)), [0] * rows)

    def decode_contiguous():
        contiguous.lengths = torch.tensor(lengths)
        forward(step, contiguous, list(range(rows)), [0] * rows)

    fresh = list(range(rows * 21 + 1, rows * 21 + 14))  # a new prompt's 13 empty blocks

    def prefill():
        forward(prompt, paged.batch([fresh], [0], 200), [0], [199])

    print("\n3. step costs, 1 thread, thread CPU ms (serving model, dim 256 x 4 layers)")
    with torch.inference_mode():
        for name, fn, tokens in (
            ("decode, 64 rows", decode, rows),
            ("  contiguous", decode_contiguous, rows),
            ("prefill, 200", prefill, 200),
        ):
            fn()
            t = time.thread_time()
            for _ in range(repeats):
                fn()
            ms = (time.thread_time() - t) / repeats * 1e3
            with profile() as prof:
                for _ in range(5):
                    fn()
            ops = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
            total = sum(ops.values())
            attention = sum(v for k, v in ops.items() if "scaled_dot_product" in k)
            print(
                f"{name:<16} {ms:6.1f} ms  {tokens / ms * 1e3:6.0f} tok/s  attention "
                f"{attention / total:4.0%}  aten::mm {ops.get('aten::mm', 0) / total:4.0%}"
                f"  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rate", type=float, default=1.0, help="arrivals per second per client")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--per-client", type=int, default=2, help="requests per client (more: a longer run)"
    )
    ap.add_argument("--part", choices=["all", "serving", "generation", "steps"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {args.threads} threads")
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("all", "serving"):
            model_dir = make_model(os.path.join(tmp, "m"), dim=256, layers=4, vocab=1000)
            serving_comparison(
                model_dir, [4] if args.quick else [16, 64], args.per_client, args.rate
            )
        if args.part in ("all", "generation"):
            generation_comparison(tmp, 8 if args.quick else 64, 32, 1 if args.quick else 3)
    if args.part == "steps":
        step_costs(5 if args.quick else 20)


if __name__ == "__main__":
    main()
