"""GRPO or on-policy distillation under a layout (dp_shard=2 or tp=2 on gloo ranks), two ways
from one run. GRPO: the ranks splitting each batch's sampling (kiln/training/rl/rank_rollouts.py,
what runs now) against every rank sampling the whole batch (what ran before). Distillation
(`--objective distill`, dp_shard): each rank scoring its share of the batch with the teacher and
the student (batch_split.py, what runs now) against every rank scoring the whole batch (what ran
before); both sides sample split. On each rank two loops are laid out the same way over the same
base; their steps alternate (the side that goes first alternates), so load from other jobs on a
shared machine falls on both alike. Prints each side's median rollout (GRPO) or update
(distillation) seconds, step seconds (rank 0's) and CPU seconds per step, the whole step's and
the update's (all ranks' together), their ratios, and the load average at the start and the
end.

    python bench/rl_layouts.py --steps 6                   # tiny random model, dp_shard=2
    python bench/rl_layouts.py --steps 6 --parallel tp=2
    python bench/rl_layouts.py --steps 6 --objective distill
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rl import TRAIN, _base, _grpo_config

from kiln.text.tokenizer import end_of_text_ids
from kiln.training.config import ParallelConfig
from kiln.training.post.teacher import load_teacher
from kiln.training.rl.batch_split import BatchSplit
from kiln.training.rl.distill import OnPolicyDistill
from kiln.training.rl.distill_config import DistillConfig
from kiln.training.rl.grpo import GRPO
from kiln.training.rl.layouts import shard_policy
from kiln.training.rl.on_policy import OnPolicyLoop
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.run import chat_template, load_policy


def _distill_config(args) -> DistillConfig:
    return DistillConfig(
        steps=args.steps,
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        max_new_tokens=args.max_new_tokens,
        divergence=args.divergence,
        optimizer={"lr": args.lr, "weight_decay": 0.0},
    )


def _loop(args, base: str, teacher: str | None, parallel: ParallelConfig, split: bool):
    policy, tok, tok_dir = load_policy(base)
    template, eos = chat_template(None, tok_dir), end_of_text_ids(tok, tok_dir)
    loop: OnPolicyLoop
    if teacher is None:
        cfg = _grpo_config(args, base)
        loop = GRPO(
            policy, tok, load_prompts(TRAIN), cfg, chat_template=template, eos_token_ids=eos
        )
    else:
        cfg = _distill_config(args)
        scorer = load_teacher("teacher", teacher, policy.cfg.vocab_size, tok)
        loop = OnPolicyDistill(
            policy, scorer, tok, load_prompts(TRAIN), cfg, chat_template=template, eos_token_ids=eos
        )
    shard_policy(loop, parallel, dist.get_world_size())
    if not split and teacher is None:
        # every rank samples the whole batch on its own engine, as before the split
        loop.rollouts = loop.rollouts.local
    elif not split:  # every rank scores the whole batch (teacher and student), as before
        loop.split = BatchSplit()
    return loop


def _cpu_timed(update, cpu: dict, key: str):
    """`update` (a loop's scoring, backward and optimizer step), its CPU seconds per call
    appended to cpu[key]."""

    def timed(*args, **kwargs):
        started = time.process_time()
        out = update(*args, **kwargs)
        cpu.setdefault(key, []).append(time.process_time() - started)
        return out

    return timed


def _rank(rank: int, world: int, port: int, args, bases: tuple, parallel: dict, out) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        loops = {
            side: _loop(args, *bases, ParallelConfig(**parallel), side == "split")
            for side in ("split", "whole")
        }
        cpu = {side: [] for side in loops}  # this rank's CPU seconds per step
        for side, loop in loops.items():
            loop._update = _cpu_timed(loop._update, cpu, f"{side} update")
        order = list(loops)
        for step in range(args.steps):
            for side in order if step % 2 == 0 else order[::-1]:
                started = time.process_time()
                loops[side].step(step)
                cpu[side].append(time.process_time() - started)
        for loop in loops.values():
            loop.close()
        metrics = {side: loop.metrics for side, loop in loops.items()} if rank == 0 else None
        out.put((rank, metrics, cpu))
    finally:
        dist.destroy_process_group()


def _median(metrics: list[dict], key: str) -> float:
    return statistics.median(m[key] for m in metrics[1:] or metrics)  # past the first: warm-up


def _close(a: list[float], b: list[float]) -> bool:
    """Step for step within 1e-5 (a split batch's sums round apart from the whole one's)."""
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b, strict=True))


def _update_s(m: dict) -> float:
    """A distillation step's seconds past its rollouts: scoring, the update and the refit."""
    return m["step_s"] * (1 - m["rollout_share"])


def _cpu_per_step(cpu: list[dict], side: str) -> float:
    """The median step's CPU seconds, every rank's together (past the first step: warm-up)."""
    per_step = [sum(steps) for steps in zip(*(c[side] for c in cpu), strict=True)]
    return statistics.median(per_step[1:] or per_step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--objective", choices=("grpo", "distill"), default="grpo")
    ap.add_argument("--parallel", default="dp_shard=2", help="one dim=N: dp_shard=2 or tp=2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument(
        "--divergence", default="reverse_kl", help="distill: reverse_kl, forward_kl, jsd"
    )
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = ap.parse_args()
    dim, n = args.parallel.split("=")
    parallel, world = {dim: int(n)}, int(n)
    distill = args.objective == "distill"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        base = _base(args.model, work)
        # distillation's teacher: another random tiny model, or the model itself (no larger one
        # of its tokenizer ships offline): the same forward's cost either way
        teacher = _base("tiny", work, "teacher", seed=1) if args.model == "tiny" else base
        bases = (base, teacher if distill else None)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_rank, args=(r, world, port, args, bases, parallel, out))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
    result = next(metrics for _, metrics, _ in results if metrics is not None)
    cpu = [c for _, _, c in results]
    split, whole = result["split"], result["whole"]
    what = f"distillation ({args.divergence})" if distill else "GRPO"
    print(
        f"{what} at {args.parallel} ({world} gloo ranks, {args.threads} thread each), model "
        f"{args.model}, {args.prompts_per_step} prompts x {args.group_size}, "
        f"{args.max_new_tokens} new tokens max, {args.steps} steps each, interleaved; "
        f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    now, before = (
        ("split scoring (now)", "whole batch per rank")
        if distill
        else ("split sampling (now)", "whole batch per rank")
    )
    for side, metrics, key in ((now, split, "split"), (before, whole, "whole")):
        part = (
            f"update s/step {statistics.median(_update_s(m) for m in metrics[1:] or metrics):.3f}"
            if distill
            else f"rollout s/step {_median(metrics, 'rollout_wait_s'):.3f}"
        )
        figure = (
            f"reverse KL mean {statistics.fmean(m['reverse_kl'] for m in metrics):.4f}  teacher "
            f"rows per rank {statistics.fmean(m['teacher_rows_per_rank'] for m in metrics):.1f}"
            if distill
            else f"reward mean {statistics.fmean(m['reward'] for m in metrics):.3f}"
        )
        print(
            f"{side:22s} {part}  step s {_median(metrics, 'step_s'):.3f}  CPU s/step (all "
            f"ranks) {_cpu_per_step(cpu, key):.3f}, of which the update "
            f"{_cpu_per_step(cpu, f'{key} update'):.3f}  {figure}  completion length mean "
            f"{statistics.fmean(m['completion_len'] for m in metrics):.1f}"
        )
    if distill:
        part = statistics.median(_update_s(m) for m in split[1:] or split) / statistics.median(
            _update_s(m) for m in whole[1:] or whole
        )
        label, keys = "update s", ("loss", "reverse_kl", "completion_len")
    else:
        part = _median(split, "rollout_wait_s") / _median(whole, "rollout_wait_s")
        label, keys = "rollout s", ("reward", "completion_len")
    step = _median(split, "step_s") / _median(whole, "step_s")
    cpu_ratio = _cpu_per_step(cpu, "split") / _cpu_per_step(cpu, "whole")
    update_cpu = _cpu_per_step(cpu, "split update") / _cpu_per_step(cpu, "whole update")
    same = all(_close([m[k] for m in split], [m[k] for m in whole]) for k in keys)
    print(
        f"ratio split / whole: {label} {part:.2f}x, step s {step:.2f}x, CPU s {cpu_ratio:.2f}x "
        f"(the update's {update_cpu:.2f}x); "
        f"{', '.join(keys)} step for step {'equal' if same else 'DIFFER'} (the same batch)"
    )


if __name__ == "__main__":
    main()
