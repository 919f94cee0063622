"""The optimizer step over DTensor parameters on CPU: `optimizer.implementation: auto` (a loop per
parameter for DTensor groups) against `foreach` (the CPU default before it), on 8 gloo ranks of
HSDP x TP (dp_replicate2 x dp_shard2 x tp2), the tiny model, 3 steps. DTensor propagates a
sharding for each foreach op over its whole parameter list; a per-parameter op reuses a cached
one. Prints the mean per-rank CPU seconds of each whole run (build, steps, clip) and the ratio;
the losses of both must be equal.

    .venv/bin/python bench/optimizer_dtensor.py [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.training.distributed import run_distributed  # noqa: E402


def train_timed(impl: str, steps: int) -> tuple[float, list[float]]:
    """On every rank: (this rank's CPU seconds, the losses) of one run."""
    import torch

    from kiln.training.config import TrainConfig
    from kiln.training.trainer import Trainer

    cfg = TrainConfig.model_validate(
        {
            "model": "tiny",
            "seq_len": 16,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "steps": steps,
            "seed": 7,
            "optimizer": {"lr": 3e-3, "grad_clip": 1.0, "implementation": impl},
            "data": {"synthetic": True, "prefetch": 0},
            "parallel": {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
        }
    )
    start = time.process_time()
    losses = [m["loss"] for m in Trainer(cfg).train()]
    assert torch.get_num_threads() == 1
    return time.process_time() - start, losses


def run(impl: str, steps: int, world: int = 8) -> tuple[float, list[float], float]:
    """(mean per-rank CPU s, rank 0's losses, wall s) of one run."""
    t0 = time.perf_counter()
    per_rank = run_distributed(train_timed, world, impl, steps, timeout=900)
    cpu = sum(r[0] for r in per_rank) / world
    return cpu, per_rank[0][1], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    ours_cpu, ours_losses, ours_wall = run("auto", args.steps)
    theirs_cpu, theirs_losses, theirs_wall = run("foreach", args.steps)
    assert ours_losses == theirs_losses, (ours_losses, theirs_losses)
    print(f"ours   auto:    {ours_cpu:.1f} CPU s per rank, {ours_wall:.1f} s wall")
    print(f"theirs foreach: {theirs_cpu:.1f} CPU s per rank, {theirs_wall:.1f} s wall")
    print(f"ratio foreach/auto: {theirs_cpu / ours_cpu:.2f}x CPU, same losses {ours_losses}")


if __name__ == "__main__":
    main()
