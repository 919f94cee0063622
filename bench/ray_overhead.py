"""Kiln on Ray Train against the same training under torchrun: steps/s past the first step.

Each preset (tiny, 125m; parallel.dp_shard=2, synthetic data, one CPU thread a rank) is trained
twice from the same YAML, as a user would run it:
  torchrun:  python -m torch.distributed.run --standalone --nproc-per-node 2
               -m kiln.training.torchrun_main --config cfg.yaml
  Ray Train: python -m kiln train --config cfg.yaml --run-dir DIR   (an embedded Ray)
Steps/s = (N - 1) / (time step N ended - time step 1 ended), from rank 0's per-step progress
lines (torchrun, ms timestamps) and metrics.jsonl (Ray). Start-up = launch to the end of step 1
(process start, Ray, worker group, model build, first step), reported separately. The median
`step_time_s` (the step itself, as the trainer times it) of each side tells a slower step (CPU
taken by Ray's own processes) from time lost between steps. Target: Ray >= 0.95x torchrun. The
machine is shared: the load average is printed with the figures.

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
STEP_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) kiln\.training: step (\d+)/.* tokens/s (\d+)"
)


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


def figures(launched: float, ends: list[tuple[int, float]], step_times: list[float]) -> tuple:
    """(steps/s past step 1, seconds from launch to the end of step 1, median step_time_s past
    step 1)."""
    ends = sorted(ends)
    (first, t1), (last, tn) = ends[0], ends[-1]
    assert first == 1 and last > 1, ends
    return (last - first) / (tn - t1), t1 - launched, statistics.median(step_times[1:])


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    e.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    return e


def run_torchrun(config: Path, tokens_per_step: int) -> tuple:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "kiln.training.torchrun_main", "--config", str(config)]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), check=False)
    if proc.returncode:
        sys.exit(f"torchrun failed:\n{proc.stderr[-3000:]}")
    ends, step_times = [], []
    for line in proc.stderr.splitlines():
        if m := STEP_LINE.match(line):
            stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            ends.append((int(m.group(2)), stamp.timestamp()))
            step_times.append(tokens_per_step / max(int(m.group(3)), 1))
    return figures(launched, ends, step_times)


def run_ray(config: Path, run_dir: Path) -> tuple:
    cmd = [sys.executable, "-m", "kiln", "train", "--config", str(config)]
    cmd += ["--run-dir", str(run_dir), "--set", f"ray.name=bench-{run_dir.name}"]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), check=False)
    if proc.returncode:
        sys.exit(f"kiln train failed:\n{proc.stderr[-3000:]}")
    with open(run_dir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return figures(
        launched, [(r["step"], r["time"]) for r in rows], [r["step_time_s"] for r in rows]
    )


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
        f"{'torchrun start s':>17} {'Ray start s':>12} {'step_time_s torchrun/Ray':>25}"
    )
    with tempfile.TemporaryDirectory(prefix="kiln-ray-bench-") as tmp:
        for preset in args.presets:
            config = write_config(Path(tmp), preset, steps[preset])
            seq_len, gbs, _ = SHAPES[preset]
            torchrun, ray = [], []
            for r in range(args.rounds):
                torchrun.append(run_torchrun(config, seq_len * gbs))
                ray.append(run_ray(config, Path(tmp) / f"{preset}-{r}"))
            t_rate, t_start, t_step = (statistics.median(x[i] for x in torchrun) for i in range(3))
            r_rate, r_start, r_step = (statistics.median(x[i] for x in ray) for i in range(3))
            print(
                f"{preset:8} {t_rate:17.2f} {r_rate:12.2f} {r_rate / t_rate:6.2f} "
                f"{t_start:17.1f} {r_start:12.1f} {t_step:12.3f} / {r_step:.3f}",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}; target: Ray >= 0.95x torchrun")


if __name__ == "__main__":
    main()
