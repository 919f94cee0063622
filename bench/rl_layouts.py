"""GRPO under a layout (dp_shard=2 or tp=2 on gloo ranks): the ranks splitting each batch's
sampling (kiln/training/rl/rank_rollouts.py, what runs now) against every rank sampling the
whole batch (what ran before), from one run. On each rank two loops are laid out the same way
over the same base; their steps alternate (the side that goes first alternates), so load from
other jobs on a shared machine falls on both alike. Prints each side's median rollout seconds
and step seconds (rank 0's), their ratio, and the load average.

    python bench/rl_layouts.py --steps 6                   # tiny random model, dp_shard=2
    python bench/rl_layouts.py --steps 6 --parallel tp=2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rl import _base, _grpo_config

from kiln.text.tokenizer import end_of_text_ids
from kiln.training.config import ParallelConfig
from kiln.training.rl.grpo import GRPO
from kiln.training.rl.layouts import shard_policy
from kiln.training.rl.prompts import load_prompts
from kiln.training.rl.run import chat_template, load_policy


def _loop(args, base: str, parallel: ParallelConfig, split: bool) -> GRPO:
    cfg = _grpo_config(args, base)
    policy, tok, tok_dir = load_policy(base)
    loop = GRPO(
        policy,
        tok,
        load_prompts(cfg.prompts),
        cfg,
        chat_template=chat_template(cfg.chat_template, tok_dir),
        eos_token_ids=end_of_text_ids(tok, tok_dir),
    )
    shard_policy(loop, parallel, dist.get_world_size())
    if not split:  # every rank samples the whole batch on its own engine, as before the split
        loop.rollouts = loop.rollouts.local
    return loop


def _rank(rank: int, world: int, port: int, args, base: str, parallel: dict, out) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        loops = {
            side: _loop(args, base, ParallelConfig(**parallel), side == "split")
            for side in ("split", "whole")
        }
        order = list(loops)
        for step in range(args.steps):
            for side in order if step % 2 == 0 else order[::-1]:
                loops[side].step(step)
        for loop in loops.values():
            loop.close()
        if rank == 0:
            out.put({side: loop.metrics for side, loop in loops.items()})
    finally:
        dist.destroy_process_group()


def _median(metrics: list[dict], key: str) -> float:
    return statistics.median(m[key] for m in metrics[1:] or metrics)  # past the first: warm-up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--parallel", default="dp_shard=2", help="one dim=N: dp_shard=2 or tp=2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts-per-step", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    args = ap.parse_args()
    dim, n = args.parallel.split("=")
    parallel, world = {dim: int(n)}, int(n)
    with tempfile.TemporaryDirectory() as work, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        base = _base(args.model, work)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_rank, args=(r, world, port, args, base, parallel, out))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        result = out.get()
        for p in procs:
            p.join()
    split, whole = result["split"], result["whole"]
    print(
        f"GRPO at {args.parallel} ({world} gloo ranks, {args.threads} thread each), model "
        f"{args.model}, {args.prompts_per_step} prompts x {args.group_size}, "
        f"{args.max_new_tokens} new tokens max, {args.steps} steps each, interleaved; "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for side, metrics in (("split sampling (now)", split), ("whole batch per rank", whole)):
        print(
            f"{side:22s} rollout s/step {_median(metrics, 'rollout_wait_s'):.3f}  "
            f"step s {_median(metrics, 'step_s'):.3f}  reward mean "
            f"{statistics.fmean(m['reward'] for m in metrics):.3f}  completion length mean "
            f"{statistics.fmean(m['completion_len'] for m in metrics):.1f}"
        )
    rollout = _median(split, "rollout_wait_s") / _median(whole, "rollout_wait_s")
    step = _median(split, "step_s") / _median(whole, "step_s")
    keys = ("reward", "completion_len")
    same = all([m[k] for m in split] == [m[k] for m in whole] for k in keys)
    print(
        f"ratio split / whole: rollout s {rollout:.2f}x, step s {step:.2f}x; rewards and "
        f"completion lengths step for step {'equal' if same else 'DIFFER'} (the same batch)"
    )


if __name__ == "__main__":
    main()
