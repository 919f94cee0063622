"""Ring attention per-step time on CPU: fused flash blocks (now) vs the fp32 matmul blocks
(before), on 2 gloo ranks (cp=2), forward + backward, one causal sequence.

    .venv/bin/python bench/ring_attention.py [--seq 4096] [--heads 8] [--kv-heads 2] [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step_seconds(args, fused: bool) -> float:
    from kiln.training.parallel.ring_attention import ring_attention

    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    local = args.seq // world
    shape = (1, args.heads, local, args.head_dim)
    kv_shape = (1, args.kv_heads, local, args.head_dim)
    q = torch.randn(shape, generator=g).requires_grad_()
    k, v = (torch.randn(kv_shape, generator=g).requires_grad_() for _ in range(2))
    times = []
    for i in range(args.steps + 1):  # the first is a warm-up
        dist.barrier()
        start = time.perf_counter()
        out = ring_attention(q, k, v, dist.group.WORLD, causal=True, fused=fused)
        out.sum().backward()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, world: int, port: int, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        matmul = _step_seconds(args, fused=False)
        fused = _step_seconds(args, fused=True)
        if rank == 0:
            results.put((matmul, fused))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_rank, args=(2, _free_port(), args, results), nprocs=2, start_method="spawn")
    matmul, fused = results.get()
    print(
        f"ring attention cp=2 S={args.seq} H={args.heads}/{args.kv_heads} D={args.head_dim} fp32, "
        f"forward+backward per step (median of {args.steps}, 1 thread per rank)"
    )
    print(f"  before (fp32 matmul blocks): {matmul * 1e3:8.1f} ms")
    print(f"  after  (fused flash blocks): {fused * 1e3:8.1f} ms")
    print(f"  speed-up: {matmul / fused:.2f}x")


if __name__ == "__main__":
    main()
