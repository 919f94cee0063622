"""The engine of this checkout against another checkout's (a commit before a change), same
workload, each side in its own process, the sides alternated.

    git worktree add ../before <commit>     # beside ../shared, whose corpus both read
    .venv/bin/python bench/engine_before_after.py --before ../before --hf-dir HF
    .venv/bin/python bench/engine_before_after.py --before ../before --hf-dir HF --dtype bf16
    .venv/bin/python bench/engine_before_after.py --before ../before --hf-dir HF --quantize int8

`bench/engine_packed.py`'s workload: --requests prompts of 42-533 tokens cut from
../shared/corpora, all submitted at once, --max-tokens new tokens greedy, one torch thread,
`Generator.load` of the HF folder (so each side lays its weights out as its own code does).
Printed per run: the side, output tokens per process CPU-second, CPU seconds, engine steps, the
load average at start and end, and a digest of every greedy completion; then the medians' ratio
(this checkout / before) and whether the two sides' greedy completions are identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(args) -> dict:
    """In the child: one engine run with the kiln on sys.path[0]; its figures as JSON."""
    import torch

    from bench.engine_packed import prompts_of, run
    from kiln.engine.engine import Engine
    from kiln.engine.generator import Generator

    torch.set_num_threads(1)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    gen = Generator.load(args.hf_dir, dtype=dtype, quantize=args.quantize)
    prompts = prompts_of(gen, args.requests)
    load = os.getloadavg()[0]
    figures, tokens = run(Engine(gen, max_slots=128), prompts, args.max_tokens)
    digest = hashlib.md5(json.dumps(tokens).encode()).hexdigest()[:12]
    return {**figures, "load": f"{load:.1f}-{os.getloadavg()[0]:.1f}", "digest": digest}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--before", required=True, help="the other checkout (its repository root)")
    ap.add_argument("--hf-dir", required=True, help="SmolLM2-135M HF export (its hf/ folder)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--quantize", choices=("int8", "int4"), help="weight-only, as `kiln serve`")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_run(args)))
        return 0
    sides = {"before": os.path.abspath(args.before), "after": HERE}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, root in sides.items():
            cmd = [sys.executable, __file__, "--child", *sys.argv[1:]]
            env = dict(os.environ, PYTHONPATH=root)
            out = subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True, text=True)
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append(figures)
            print(
                f"{name:6s} {figures['tok_cpu']:6.1f} tok/CPU-s  {figures['cpu']:6.1f} CPU-s  "
                f"{figures['steps']} steps  load {figures['load']}  greedy {figures['digest']}",
                flush=True,
            )
    med = {name: statistics.median(r["tok_cpu"] for r in runs) for name, runs in results.items()}
    digests = {r["digest"] for runs in results.values() for r in runs}
    print(
        f"median tok/CPU-s: before {med['before']:.1f}, after {med['after']:.1f}, "
        f"after/before {med['after'] / med['before']:.2f}x; greedy completions "
        f"{'identical' if len(digests) == 1 else 'DIFFER'} across runs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
