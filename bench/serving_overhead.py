"""Where `kiln serve` spends CPU outside its engine: idle and under a streaming load, per process
of the server's tree and the engine thread's share, optionally beside another checkout's server.

    .venv/bin/python bench/serving_overhead.py --hf-dir HF                     # this checkout
    .venv/bin/python bench/serving_overhead.py --hf-dir HF --before ../main    # before/after

Each server is `kiln serve HF` started from its checkout (bench/serving_vllm.py's Server, client
and prompts: unique corpus prompts of 42-533 tokens, --max-tokens new tokens, temperature 0).
Printed per server: idle cores over --idle seconds by process, then for each of two alternated
rounds at --concurrency: tokens per server CPU-second, the engine thread's CPU (the busiest
thread of the Serve replica, where torch runs) and the share of the tree's CPU outside it, with
the CPU of every process in the tree. Ray's daemons cost about the same per second idle or busy,
so their share of a level grows with its wall time (a loaded machine's); the per-token cost of
streaming is the proxy's and the replica's CPU beyond their idle rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving_vllm as sv  # noqa: E402


def tree_cpu(server: sv.Server) -> dict[int, tuple[str, float]]:
    """pid -> (process title, CPU seconds) over the server's process tree."""
    out = {}
    try:
        root = psutil.Process(server.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = (" ".join(p.cmdline())[:70], t.user + t.system)
        except psutil.NoSuchProcess:
            pass
    return out


def by_process(before: dict, after: dict, seconds: float, top: int = 8) -> list[str]:
    deltas = {pid: after[pid][1] - before[pid][1] for pid in after if pid in before}
    rows = sorted(deltas.items(), key=lambda item: -item[1])[:top]
    return [f"    {d / seconds:7.3f}  {after[pid][0]}" for pid, d in rows]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hf-dir", required=True, help="HF folder to serve")
    ap.add_argument("--before", metavar="CHECKOUT", help="also serve from this kiln checkout")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="requests per round and server")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle measurement")
    args = ap.parse_args()

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkouts = [("before", os.path.abspath(args.before))] if args.before else []
    checkouts.append(("after" if args.before else "kiln", here))
    servers = []
    for name, repo in checkouts:
        port = sv.free_port()
        cmd = [sys.executable, "-m", "kiln", "serve", args.hf_dir, "--port", str(port)]
        log = f"/tmp/kiln-serving-overhead-{name}-{port}.log"
        servers.append(sv.Server(name, cmd, port, sv.kiln_env(repo), log, cwd=repo))
    try:
        for s in servers:
            s.wait_ready(1200)
        sets = sv.prompt_sets(args.hf_dir, [2, args.requests, args.requests], seed=5)
        for s in servers:  # warm-up
            sv.greedy_texts(s, sets[0], 8)
        for s in servers:
            a = tree_cpu(s)
            time.sleep(args.idle)
            b = tree_cpu(s)
            total = sum(b[p][1] - a[p][1] for p in b if p in a) / args.idle
            print(f"{s.name}: idle {total:.3f} cores, load {os.getloadavg()[0]:.1f}", flush=True)
            print("\n".join(by_process(a, b, args.idle)), flush=True)
        for round_, order in enumerate([servers, servers[::-1]]):
            for s in order:
                load = os.getloadavg()[0]
                a = tree_cpu(s)
                r = asyncio.run(
                    sv.run_level(s, sets[1 + round_], args.concurrency, args.max_tokens)
                )
                b = tree_cpu(s)
                engine = r["cpu_s"] * (1 - r["outside"] / 100)
                print(
                    f"round {round_} {s.name}: c={args.concurrency} {r['tokens']} tokens in "
                    f"{r['wall']:.1f} s, server CPU {r['cpu_s']:.1f} s ({r['tok_cpu_s']:.1f} "
                    f"tok/CPU-s), engine thread {engine:.1f} s, outside it {r['outside']:.1f}%, "
                    f"load {load:.1f}->{os.getloadavg()[0]:.1f}; CPU-s by process:",
                    flush=True,
                )
                print("\n".join(by_process(a, b, 1.0)), flush=True)
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
