"""Decode attention over the paged KV cache: the gather path (each row's blocks copied into a
[rows, Hkv, end, Dh] buffer, then SDPA) against the in-place kernel (kiln/model/
paged_attention.py), one layer of SmolLM2-135M's shape (9 query heads, 3 kv heads, Dh 64, 16-slot
blocks), decode rows of 42-597 cached tokens as bench/serving_vllm.py's prompts plus 64 new.

    .venv/bin/python bench/paged_attention.py --rows 8,32 --dtype float32,bfloat16

The two sides alternate within one run; printed: ms per layer for each, the ratio, the largest
output difference and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.model.attention import AttentionCore  # noqa: E402
from kiln.model.paged_kv_cache import PagedKVCache  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


def setup(rows: int, dtype: torch.dtype, seed: int = 0):
    rng = random.Random(seed)
    lengths = [rng.randint(42, 533) + rng.randint(0, 63) for _ in range(rows)]
    lengths.sort(reverse=True)  # the engine orders decoding rows longest first
    need = sum(-(-(n + 1) // BLOCK) for n in lengths) + 1
    cache = PagedKVCache(1, need + 1, BLOCK, KV_HEADS, DIM, dtype=dtype)
    ids = list(range(1, need + 1))
    rng.shuffle(ids)  # blocks scattered through the pool, as after a while of serving
    tables, at = [], 0
    for n in lengths:
        k = -(-(n + 1) // BLOCK)
        tables.append(ids[at : at + k])
        at += k
    cache.zero_through(need)
    cache.k[0].normal_()
    cache.v[0].normal_()
    return cache, tables, lengths


def time_attend(batch, q, k, v, core, reps: int) -> tuple[float, torch.Tensor]:
    batch.begin(batch.seq_len)
    out = batch.attend(0, q, k, v, core)
    start = time.perf_counter()
    for _ in range(reps):
        out = batch.attend(0, q, k, v, core)
    return (time.perf_counter() - start) / reps * 1e3, out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", default="8,32")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
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


if __name__ == "__main__":
    raise SystemExit(main())
