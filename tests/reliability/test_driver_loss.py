"""Driver loss on the 2-node cluster: a pipeline submitted with `kiln submit` loses its driver
(SIGKILL, so the job dies) while `train` is paused at step 3 on its Ray Train workers. Submitted
again, it reuses the finished stages, resumes `train` from the step-2 checkpoint, and every loss
equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from kiln.platform.jobs import logs, status
from kiln.training.config import TrainConfig
from kiln.training.metrics_log import read_metrics
from tests.reliability.faults import DRIVER_KILL_STEP

STEPS = 4  # a checkpoint at 2 (resumed from) and 4
TRAIN = {
    "model": "tiny",
    "steps": STEPS,
    "seq_len": 32,
    "global_batch_size": 2,
    "micro_batch_size": 1,
    "log_every": 5,
    "data": {"synthetic": True},
    "checkpoint": {"interval_steps": 2},
}
RAY = {
    "num_workers": 1,  # a resume from a checkpoint needs no second rank (test_elastic has 4)
    "cpus_per_worker": 0.5,
    "callbacks": ["tests.reliability.faults:pause_first_attempt"],
}


def _spec(docs: Path) -> dict:
    # an absolute input path: each job runs in its own copy of the uploaded working folder
    return {
        "pipeline": "driverloss",
        "stages": [
            {"stage": "text.read", "name": "read", "config": {"paths": [str(docs)]}},
            {"stage": "text.stats", "name": "stats"},
            {"stage": "train", "name": "train", "config": {**TRAIN, "ray": RAY}},
        ],
    }


def _submit(cluster, work: Path, runs: Path, job_id: str) -> None:
    python = cluster.loopback_python(work.parent)
    args = ["submit", "spec.yaml", "--address", cluster.dashboard_url, "--runs-dir", str(runs)]
    out = subprocess.run(
        [sys.executable, "-m", "kiln", *args, "--python", str(python), "--job-id", job_id],
        cwd=work,
        env={**os.environ, "RAY_ADDRESS": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def _job_state(cluster, job_id: str, until, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = status(job_id, cluster.dashboard_url)
        if until(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _driver_pids(runs: Path) -> list[int]:
    """The job's `python -m kiln run` process (its command line names our runs folder)."""
    pids = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "run" in cmd and str(runs) in cmd and "kiln" in cmd:
            pids.append(p.pid)
    return pids


def _runs(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob("driverloss/*/run.json"))]


def _reference(out: list) -> None:
    from kiln.training.trainer import Trainer

    out.extend(m["loss"] for m in Trainer(TrainConfig.model_validate(TRAIN)).train())


@pytest.mark.slow
def test_driver_killed_mid_train_resubmit_resumes_from_checkpoint(two_nodes, tmp_path):
    work, runs = tmp_path / "work", tmp_path / "runs"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("one two three")
    work.mkdir()
    (work / "spec.yaml").write_text(json.dumps(_spec(tmp_path / "docs")))
    reference: list[float] = []
    ref_thread = threading.Thread(target=_reference, args=(reference,))
    ref_thread.start()
    try:
        _submit(two_nodes, work, runs, "killed")
        # bounds, not waits: a job on a machine shared with CPU hogs took > 240 s to get here
        deadline = time.monotonic() + 420
        while not list(runs.glob("driverloss/*/train/paused-rank*")):
            state = status("killed", two_nodes.dashboard_url)
            assert state in ("PENDING", "RUNNING"), logs("killed", two_nodes.dashboard_url)[-3000:]
            assert time.monotonic() < deadline, f"train never reached step {DRIVER_KILL_STEP}"
            time.sleep(0.2)
        (pid,) = _driver_pids(runs)
        os.kill(pid, signal.SIGKILL)
        state = _job_state(two_nodes, "killed", lambda s: s not in ("PENDING", "RUNNING"), 60)
        assert state == "FAILED"
        (killed,) = _runs(runs)
        assert killed["stages"]["train"]["status"] == "running"  # the driver died inside it

        _submit(two_nodes, work, runs, "again")
        # a bound: beside `stress-ng --cpu 2` (load ~12) the resumed job was still in its
        # second step after 300 s
        state = _job_state(
            two_nodes, "again", lambda s: s in ("SUCCEEDED", "FAILED", "STOPPED"), 600
        )
        assert state == "SUCCEEDED", logs("again", two_nodes.dashboard_url)[-3000:]
    finally:
        for pid in _driver_pids(runs):  # never leave a paused driver behind a failed assertion
            os.kill(pid, signal.SIGKILL)
        ref_thread.join()
    first, second = _runs(runs)
    assert [second["stages"][s]["status"] for s in ("read", "stats", "train")] == [
        "cached",
        "cached",
        "done",
    ]
    run_dirs = sorted(p.parent for p in runs.glob("driverloss/*/run.json"))
    before = read_metrics(str(run_dirs[0] / "train"))
    after = read_metrics(str(run_dirs[1] / "train"))
    assert [h["step"] for h in before] == [1, 2, 3]  # paused inside 3: its checkpoint is 2
    assert [h["step"] for h in after] == [3, 4]  # resumed from the step-2 checkpoint
    assert after[0]["loss"] == before[2]["loss"]  # step 3 again, from the same state
    losses = {h["step"]: h["loss"] for h in before[:2] + after}
    for step, loss in losses.items():
        assert abs(loss - reference[step - 1]) < 1e-4, (step, loss, reference)
