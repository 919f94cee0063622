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
import multiprocessing as mp
import os
import socket
import time

CTX = mp.get_context("forkserver")


def _rank(rank: int, world: int, port: int, impl: str, steps: int, queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    import torch
    import torch.distributed as dist

    from kiln.training.config import TrainConfig
    from kiln.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
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
    queue.put((rank, time.process_time() - start, losses))
    dist.destroy_process_group()


def run(impl: str, steps: int, world: int = 8) -> tuple[float, list[float], float]:
    """(mean per-rank CPU s, rank 0's losses, wall s) of one run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = CTX.Queue()
    procs = [
        CTX.Process(target=_rank, args=(r, world, port, impl, steps, queue)) for r in range(world)
    ]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    cpu = sum(r[1] for r in results) / world
    return cpu, results[0][2], time.perf_counter() - t0


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
