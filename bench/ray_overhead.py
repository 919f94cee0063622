"""Kiln on Ray Train against the same training under torchrun: steps/s past the first step.

Each preset (tiny, 125m; parallel.dp_shard=2, synthetic data, one CPU thread a rank) is trained
twice from the same YAML, as a user would run it:
  torchrun:  python -m torch.distributed.run --standalone --nproc-per-node 2
               -m kiln.training.torchrun_main --config cfg.yaml
  Ray Train: python -m kiln train --config cfg.yaml --run-dir DIR   (an embedded Ray)
Steps/s = (N - 1) / (time step N ended - time step 1 ended), from rank 0's per-step progress
lines (torchrun, ms timestamps) and metrics.jsonl (Ray). Start-up = launch to the end of step 1
(process start, Ray, worker group, model build, first step), reported separately. Target: Ray
>= 0.95x torchrun. The machine is shared: the load average is printed with the figures.

    .venv/bin/python bench/ray_overhead.py [--presets tiny 125m] [--steps 40 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SHAPES = {  # seq_len, global batch, micro batch: a step of ~0.1 s (tiny) and a few s (125m) on CPU
    "tiny": (64, 8, 4),
    "125m": (128, 2, 1),
}
STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) kiln\.training: step (\d+)/")


def write_config(folder: Path, preset: str, steps: int) -> Path:
    seq_len, gbs, mbs = SHAPES[preset]
    cfg = {
        "model": preset,
        "parallel": {"dp_shard": 2},
        "steps": steps,
        "seq_len": seq_len,
        "global_batch_size": gbs,
        "micro_batch_size": mbs,
        "log_every": 1,
        "device": "cpu",
        "data": {"synthetic": True},
        "checkpoint": {"save_final": False},  # no checkpoint on either side
    }
    path = folder / f"{preset}.yaml"
    path.write_text(yaml.safe_dump({"train": cfg}))
    return path


def rate_and_startup(launched: float, ends: list[tuple[int, float]]) -> tuple[float, float]:
    """(steps/s past step 1, seconds from launch to the end of step 1)."""
    ends = sorted(ends)
    (first, t1), (last, tn) = ends[0], ends[-1]
    assert first == 1 and last > 1, ends
    return (last - first) / (tn - t1), t1 - launched


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    e.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    return e


def run_torchrun(config: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "kiln.training.torchrun_main", "--config", str(config)]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), check=False)
    if proc.returncode:
        sys.exit(f"torchrun failed:\n{proc.stderr[-3000:]}")
    ends = []
    for line in proc.stderr.splitlines():
        if m := STEP_LINE.match(line):
            stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            ends.append((int(m.group(2)), stamp.timestamp()))
    return rate_and_startup(launched, ends)


def run_ray(config: Path, run_dir: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "kiln", "train", "--config", str(config)]
    cmd += ["--run-dir", str(run_dir), "--set", f"ray.name=bench-{run_dir.name}"]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), check=False)
    if proc.returncode:
        sys.exit(f"kiln train failed:\n{proc.stderr[-3000:]}")
    with open(run_dir / "metrics.jsonl") as f:
        ends = [(row["step"], row["time"]) for row in map(json.loads, f)]
    return rate_and_startup(launched, ends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "125m"], choices=list(SHAPES))
    parser.add_argument("--steps", nargs="+", type=int, default=[40, 8], help="per preset")
    parser.add_argument("--rounds", type=int, default=1, help="torchrun/Ray pairs (medians)")
    args = parser.parse_args()
    steps = dict(zip(args.presets, args.steps + args.steps[-1:] * len(args.presets), strict=False))
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print(
        f"{'preset':8} {'torchrun steps/s':>17} {'Ray steps/s':>12} {'ratio':>6} "
        f"{'torchrun start s':>17} {'Ray start s':>12}"
    )
    with tempfile.TemporaryDirectory(prefix="kiln-ray-bench-") as tmp:
        for preset in args.presets:
            config = write_config(Path(tmp), preset, steps[preset])
            torchrun, ray = [], []
            for r in range(args.rounds):
                torchrun.append(run_torchrun(config))
                ray.append(run_ray(config, Path(tmp) / f"{preset}-{r}"))
            t_rate = statistics.median(x[0] for x in torchrun)
            r_rate = statistics.median(x[0] for x in ray)
            t_start = statistics.median(x[1] for x in torchrun)
            r_start = statistics.median(x[1] for x in ray)
            print(
                f"{preset:8} {t_rate:17.2f} {r_rate:12.2f} {r_rate / t_rate:6.2f} "
                f"{t_start:17.1f} {r_start:12.1f}",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}; target: Ray >= 0.95x torchrun")


if __name__ == "__main__":
    main()
