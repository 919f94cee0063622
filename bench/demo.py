"""Time `make demo` (kiln run kiln/pipelines/quickstart.yaml) after the install, as a user runs it.

    .venv/bin/python bench/demo.py [--set sft.steps=8 ...] [--runs-dir DIR]

Prints the wall time against the 6-minute target and the ratio, the terminal's line count
(target < 60), the taught facts the tuned answers hold and the run folder's size on disk, and
checks what the demo promises: the run succeeded, every taught fact holds, and the terminal shows
no traceback or warning. Exit 1 when a check fails. Run it with the venv a bare install makes
(`make .venv/.kiln-installed .venv/.kiln-model-installed`) to measure what a new user gets.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 360.0
MAX_LINES = 60
DEMO_OVERRIDES = ["compare.require_taught=true"]  # as `make demo` runs it (the Makefile)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_demo(runs_dir: str, overrides: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    cmd = [str(REPO / ".venv" / "bin" / "kiln"), "run", "kiln/pipelines/quickstart.yaml"]
    cmd += ["--runs-dir", runs_dir]
    for o in DEMO_OVERRIDES + overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    env = {"RAY_AUTH_MODE": "disabled", **os.environ}  # as `make demo` runs it
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    return time.perf_counter() - t0, out


def disk_bytes(folder: Path) -> int:
    """Bytes the folder takes on disk, a hard-linked file counted once (as `du` does)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in folder.rglob("*"):
        st = path.lstat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def answers(runs_dir: str) -> list[dict] | None:
    found = sorted(Path(runs_dir).glob("quickstart/*/compare/answers/answers.json"))
    return json.loads(found[-1].read_text()) if found else None


def check(runs_dir: str, out: subprocess.CompletedProcess) -> list[str]:
    """What the demo promises, as a list of failures (empty: all held)."""
    text = out.stdout + out.stderr
    failures = []
    if out.returncode != 0:
        failures.append(f"exit code {out.returncode}")
    lines = text.count("\n")
    if lines >= MAX_LINES:
        failures.append(f"{lines} terminal lines (target < {MAX_LINES})")
    for word in ("Traceback", "Warning"):
        if word in text:
            failures.append(f"{word!r} in the terminal output")
    rows = answers(runs_dir)
    if rows is None:
        failures.append("no compare/answers/answers.json")
    else:
        failures += [
            f"not taught: {r['question']} -> {r['tuned']!r}" for r in rows if not r["taught"]
        ]
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--runs-dir", default=None)
    args = ap.parse_args()
    runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="kiln-demo-")
    overrides = list(args.overrides)
    if not any(o.startswith("serve.port=") for o in overrides):  # a shared machine: a free port
        overrides.append(f"serve.port={free_port()}")
    wall, out = run_demo(runs_dir, overrides)
    sys.stdout.write(out.stdout + out.stderr)
    lines = (out.stdout + out.stderr).count("\n")
    print("\n| figure | kiln demo | target | ratio |\n| --- | --- | --- | --- |")
    print(f"| wall time after install (s) | {wall:.0f} | {TARGET_S:.0f} | {wall / TARGET_S:.2f} |")
    print(f"| terminal lines | {lines} | < {MAX_LINES} | {lines / MAX_LINES:.2f} |")
    rows = answers(runs_dir) or []
    taught = sum(bool(r["taught"]) for r in rows)
    print(f"| taught facts in the tuned answers | {taught}/{len(rows)} | all | |")
    runs = sorted(Path(runs_dir).glob("quickstart/*/"))
    if runs:
        size = disk_bytes(runs[-1]) / 1e9
        print(f"| run folder on disk (GB) | {size:.2f} | | |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (2 cores); runs: {runs_dir}")
    failures = check(runs_dir, out)
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
