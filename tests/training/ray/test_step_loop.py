"""The step loop on Ray Train: nothing waits on Ray between steps, one console line per logged step.

One Ray Train fit (2 workers, dp_shard=2, ~0.1 s steps, async checkpoints every 4 steps) checks:
- the steps land as fast as they run: the median gap between consecutive steps in metrics.jsonl
  is within 20% of the median `step_time_s` (it was ~2 s, Ray Train's report queue, per step);
- Ray Train still learns of the newest checkpoint and the final metrics (its own `Result`);
- the driver's console shows exactly one line per logged step, and none of Ray Train's
  "Reporting training result" lines (those go to <run_dir>/logs/).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time

import pytest

from kiln.training.config import TrainConfig
from kiln.training.ray_report import POINTER_FILE
from kiln.training.ray_train import RayOptions, train_on_ray

STEPS, LOG_EVERY = 20, 3
CONFIG = {
    "model": "tiny",
    "parallel": {"dp_shard": 2},
    "steps": STEPS,
    "seq_len": 64,
    "global_batch_size": 8,
    "micro_batch_size": 4,
    "log_every": LOG_EVERY,
    "data": {"synthetic": True},
    "checkpoint": {"interval_steps": 4, "async": True},
}
STEP_LINE = re.compile(r"(?<!checkpoint )\bstep (\d+)\b")


def _console_after(capfd, done: re.Pattern, timeout: float = 60.0, quiet_s: float = 1.0) -> str:
    """Everything printed so far: waits for Ray's forwarded worker lines to reach `done`, then
    until nothing new arrives for `quiet_s` (a duplicate would come right behind the original)."""
    out, deadline = "", time.monotonic() + timeout
    last_news = time.monotonic()
    while time.monotonic() < deadline:
        captured = capfd.readouterr()
        if captured.out or captured.err:
            out += captured.out + captured.err
            last_news = time.monotonic()
        elif done.search(out) and time.monotonic() - last_news >= quiet_s:
            return out
        time.sleep(0.1)
    return out


@pytest.mark.slow
def test_steps_do_not_wait_on_ray_and_log_once(ray_session, tmp_path, capfd):
    import ray.train

    run_dir = tmp_path / "run"
    options = RayOptions(cpus_per_worker=0.5, name="step-loop", storage_path=str(tmp_path / "ray"))
    capfd.readouterr()
    summary = train_on_ray(TrainConfig.model_validate(CONFIG), str(run_dir), options)
    console = _console_after(capfd, re.compile(rf"\bstep {STEPS}/{STEPS}\b"))

    with open(run_dir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False)]
    step_time = statistics.median(r["step_time_s"] for r in rows[1:])
    # short enough that Ray Train's ~2 s report wait, were it still per step, would show
    assert 0.03 < step_time < 1.5, step_time
    # a gap of step_time + ~2 s (Ray's report wait) would be a ratio of 2 or more; 1.5 leaves
    # room for a loaded machine's jitter between steps
    ratio = statistics.median(gaps) / step_time
    assert 0.8 <= ratio <= 1.5, (ratio, gaps, [r["step_time_s"] for r in rows])

    # Ray Train's own record loads (as it does to resume the run by name: every checkpoint it
    # names still exists) and its latest checkpoint points at the final one.
    result = ray.train.Result.from_path(tmp_path / "ray" / "step-loop")
    with open(os.path.join(result.checkpoint.path, POINTER_FILE)) as f:
        assert json.load(f)["uri"] == summary["checkpoint"]
    assert summary["checkpoint"].endswith(f"step-{STEPS:08d}")
    assert result.metrics["step"] == STEPS and result.metrics["final"] is True
    assert summary["final"]["step"] == STEPS

    logged = [int(m.group(1)) for line in console.splitlines() if (m := STEP_LINE.search(line))]
    expected = [s for s in range(1, STEPS + 1) if s % LOG_EVERY == 0 or s == STEPS]
    assert sorted(logged) == expected, console
    assert "Reporting training result" not in console
    ray_log = (run_dir / "logs" / "ray-train-rank0.log").read_text()
    assert "Reporting training result" in ray_log  # routed to the run folder, not dropped
