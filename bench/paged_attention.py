"""Decode attention over the paged KV cache: the gather path (each row's blocks copied into a
[rows, Hkv, end, Dh] buffer, then SDPA) against the in-place op (kiln/model/paged_attention.py).

    .venv/bin/python bench/paged_attention.py --rows 8,32 --dtype float32,bfloat16
    .venv/bin/python bench/paged_attention.py --hf-dir HF --rows 8,32   # whole decode steps

Without --hf-dir: the attention layers of SmolLM2-135M's shape (30 layers, 9 query heads, 3 kv
heads, Dh 64, 16-slot blocks scattered through the pool), each layer in turn (so its keys and
values come from memory, as in a step), decode rows of 42-596 cached tokens (the prompts of
bench/serving_vllm.py plus up to 63 new). With --hf-dir (SmolLM2-135M's HF export): whole
one-token decode steps of the model, one forward of `rows` rows packed, after real prompts of
42-533 tokens (bench/engine_packed.py's) were prefilled into the paged cache. One torch thread.
The two sides alternate within one run; printed: ms per layer or step for each (best of
--rounds), the ratio, the largest output difference and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.engine_packed import prompts_of  # noqa: E402
from kiln.engine.generator import Generator  # noqa: E402
from kiln.model.attention import AttentionCore  # noqa: E402
from kiln.model.paged_kv_cache import PagedKVCache  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK, LAYERS = 9, 3, 64, 16, 30


def setup(rows: int, dtype: torch.dtype, seed: int = 0):
    rng = random.Random(seed)
    lengths = [rng.randint(42, 533) + rng.randint(0, 63) for _ in range(rows)]
    lengths.sort(reverse=True)  # the engine orders decoding rows longest first
    need = sum(-(-(n + 1) // BLOCK) for n in lengths) + 1
    cache = PagedKVCache(LAYERS, need + 1, BLOCK, KV_HEADS, DIM, dtype=dtype)
    ids = list(range(1, need + 1))
    rng.shuffle(ids)  # blocks scattered through the pool, as after a while of serving
    tables, at = [], 0
    for n in lengths:
        k = -(-(n + 1) // BLOCK)
        tables.append(ids[at : at + k])
        at += k
    cache.zero_through(need)
    for pool in cache.k + cache.v:
        pool.normal_()
    return cache, tables, lengths


def time_attend(batch, q, k, v, core, reps: int) -> tuple[float, torch.Tensor]:
    batch.begin(batch.seq_len)
    out = batch.attend(0, q, k, v, core)
    start = time.perf_counter()
    for _ in range(reps):
        for layer in range(LAYERS):  # each layer's keys/values from memory, as in a step
            out = batch.attend(layer, q, k, v, core)
    return (time.perf_counter() - start) / reps / LAYERS * 1e3, out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", default="8,32")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hf-dir", help="time whole decode steps of this SmolLM2-135M HF export")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.hf_dir:
        return steps(args)
    torch.manual_seed(0)
    core = AttentionCore(DIM)
    print(f"threads {args.threads}, load average {os.getloadavg()}")
    for name in args.dtype.split(","):
        dtype = getattr(torch, name)
        for rows in (int(r) for r in args.rows.split(",")):
            cache, tables, lengths = setup(rows, dtype)
            gathering = cache.packed(tables, lengths, [1] * rows, in_place=False)
            in_place = cache.packed(tables, lengths, [1] * rows, in_place=True)
            q = torch.randn(1, HEADS, rows, DIM, dtype=dtype)
            k = torch.randn(1, KV_HEADS, rows, DIM, dtype=dtype)
            v = torch.randn(1, KV_HEADS, rows, DIM, dtype=dtype)
            gather, kernel = [], []
            for _ in range(args.rounds):
                t, ref = time_attend(gathering, q, k, v, core, args.reps)
                gather.append(t)
                t, out = time_attend(in_place, q, k, v, core, args.reps)
                kernel.append(t)
            g, p = min(gather), min(kernel)
            diff = (out.float() - ref.float()).abs().max().item()
            print(
                f"{name:8s} rows {rows:3d} keys {sum(lengths) + rows:6d}  gather+SDPA {g:7.3f} ms"
                f"  in-place {p:7.3f} ms  ratio {g / p:5.2f}x  max|diff| {diff:.2e}"
                f"  load {os.getloadavg()[0]:.2f}"
            )
    return 0


def steps(args) -> int:
    """Whole decode steps of the model: the same packed forward with and without the op."""
    print(f"threads {args.threads}, load average {os.getloadavg()}")
    rows_list = [int(r) for r in args.rows.split(",")]
    for name in args.dtype.split(","):
        dtype = getattr(torch, name)
        gen = Generator.load(args.hf_dir, dtype=dtype)
        model = gen.model
        prompts = sorted(prompts_of(gen, max(rows_list)), key=len, reverse=True)
        need = sum(-(-(len(p) + 1) // BLOCK) for p in prompts)
        cache = PagedKVCache.for_model(model.cfg, need + 1, BLOCK, dtype=dtype)
        tables, at = [], 1
        for p in prompts:
            k = -(-(len(p) + 1) // BLOCK)
            tables.append(list(range(at, at + k)))
            at += k
        with torch.inference_mode():
            for p, table in zip(prompts, tables, strict=True):
                model(torch.tensor([p]), kv_cache=cache.packed([table], [0], [len(p)]))
            for rows in rows_list:
                lengths = [len(p) for p in prompts[:rows]]
                tokens = torch.tensor([[p[-1] for p in prompts[:rows]]])
                index = (torch.zeros(rows, dtype=torch.long), torch.arange(rows))
                times = {False: [], True: []}
                logits = {}
                for _ in range(args.rounds):
                    for in_place in (False, True):
                        start = time.perf_counter()
                        for _ in range(args.reps // 3 or 1):
                            batch = cache.packed(
                                tables[:rows], lengths, [1] * rows, in_place=in_place
                            )
                            logits[in_place] = model(tokens, kv_cache=batch, logits_positions=index)
                        times[in_place].append(
                            (time.perf_counter() - start) / (args.reps // 3 or 1) * 1e3
                        )
                g, p = min(times[False]), min(times[True])
                diff = (logits[True].float() - logits[False].float()).abs().max().item()
                same = torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
                print(
                    f"{name:8s} step of {rows:3d} rows ({sum(lengths) + rows} keys)  gather+SDPA"
                    f" {g:7.1f} ms  in-place {p:7.1f} ms  ratio {g / p:5.2f}x  logits max|diff|"
                    f" {diff:.2e}, argmax same {same}  load {os.getloadavg()[0]:.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
