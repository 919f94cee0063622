"""`kiln run` stops within 10 s of SIGINT or SIGTERM (exit 130 / 143, one "interrupted" line),
shutting its embedded Ray down, even when it inherited SIGINT ignored (as from a non-interactive
shell's `cmd &`); run.json and the report say `interrupted`, with every stage's real state. A
training stage stopped so resumes from its checkpoint on the next run and says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ignore_sigint() -> None:  # what a background non-interactive shell hands its children
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_kiln_run_stops_on_sigint_even_if_inherited_ignored(tmp_path):
    marker = tmp_path / "hanging"
    (tmp_path / "spec.yaml").write_text(
        "pipeline: sig\nstages:\n  - stage: noop\n"
        "  - stage: tests.platform.stages_for_tests:HangOnce\n"
        f"    config: {{marker: '{marker}', log: '{tmp_path / 'log'}'}}\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln",
            "-v",
            "run",
            "spec.yaml",
            "--runs-dir",
            "runs",
            "--run-id",
            "r",
        ],
        cwd=tmp_path,
        env={**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), proc.communicate(timeout=30)[1][-3000:]
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert stopped_s < 10, stopped_s
    lines = err.strip().splitlines()
    assert lines[-1] == "kiln: interrupted"
    assert sum("shutting down the embedded Ray" in line for line in lines) == 1  # -v shows it
    record = json.loads((tmp_path / "runs/sig/r/run.json").read_text())
    assert record["status"] == "interrupted" and record["interrupted_by"] == "SIGINT"
    states = {name: entry["status"] for name, entry in record["stages"].items()}
    assert states == {"noop": "done", "test.hang": "interrupted"}


def _kiln_run(tmp_path: Path, run_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", "run", "spec.yaml", "--runs-dir", "runs"]
        + ["--run-id", run_id],
        cwd=tmp_path,
        env={**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _signal_once_there(proc: subprocess.Popen, path: Path, signum: int) -> str:
    """Wait for `path` (the stage is running), send `signum`; the command's stderr."""
    try:
        deadline = time.monotonic() + 240
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert path.exists(), proc.communicate(timeout=60)[1][-3000:]
        proc.send_signal(signum)
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_sigterm_is_exit_143_and_every_stage_keeps_its_state(tmp_path):
    """No Ray here (three stages that need none): a cheap subprocess."""
    marker, log = tmp_path / "hanging", tmp_path / "log"
    count = "tests.platform.stages_for_tests:CountRuns"
    spec = {
        "pipeline": "term",
        "stages": [
            {"stage": count, "name": "before", "config": {"log": str(log)}},
            {
                "stage": "tests.platform.stages_for_tests:HangOnce",
                "name": "hang",
                "config": {"marker": str(marker), "log": str(log)},
            },
            {"stage": count, "name": "after", "config": {"log": str(log)}},
        ],
    }
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))  # JSON is YAML
    proc = _kiln_run(tmp_path, "r")
    err = _signal_once_there(proc, marker, signal.SIGTERM)
    assert proc.returncode == 143, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == "kiln: interrupted" and sum("interrupt" in ln for ln in lines) == 1, lines
    assert "Traceback" not in err
    record = json.loads((tmp_path / "runs/term/r/run.json").read_text())
    assert record["status"] == "interrupted" and record["interrupted_by"] == "SIGTERM"
    states = {name: entry["status"] for name, entry in record["stages"].items()}
    assert states == {"before": "done", "hang": "interrupted", "after": "pending"}
    assert "error" not in record
    report = (tmp_path / "runs/term/r/report.html").read_text()
    assert 'class="status interrupted">interrupted' in report
    assert 'class="status failed"' not in report


@pytest.mark.slow
def test_ctrl_c_during_training_then_the_rerun_resumes_and_says_so(tmp_path):
    """SIGINT while the train stage's Ray Train worker is paused at step 3 (after the step-2
    checkpoint): exit 130, the stage `interrupted`, the next stage `pending`; the same spec run
    again resumes from step 2, on the console and in the report."""
    train = {
        "model": "tiny",
        "steps": 4,
        "seq_len": 32,
        "global_batch_size": 2,
        "micro_batch_size": 1,
        "log_every": 5,
        "data": {"synthetic": True},
        "checkpoint": {"interval_steps": 2},
        "ray": {  # the worker waits at step 3 on a run that did not resume (until killed)
            "num_workers": 1,
            "cpus_per_worker": 0.5,
            "callbacks": ["tests.reliability.faults:pause_first_attempt"],
        },
    }
    spec = {
        "pipeline": "ctrlc",
        "stages": [
            {"stage": "train", "config": train},
            {
                "stage": "tests.platform.stages_for_tests:CountRuns",
                "name": "after",
                "config": {"log": str(tmp_path / "log")},
            },
        ],
    }
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))  # JSON is YAML
    proc = _kiln_run(tmp_path, "first")
    err = _signal_once_there(proc, tmp_path / "runs/ctrlc/first/train/paused-rank0", signal.SIGINT)
    assert proc.returncode == 130, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == "kiln: interrupted" and sum("interrupt" in ln for ln in lines) == 1, lines
    record = json.loads((tmp_path / "runs/ctrlc/first/run.json").read_text())
    states = {name: entry["status"] for name, entry in record["stages"].items()}
    assert record["status"] == "interrupted"
    assert states == {"train": "interrupted", "after": "pending"}
    assert 'class="status interrupted"' in (tmp_path / "runs/ctrlc/first/report.html").read_text()

    again = _kiln_run(tmp_path, "second")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert any(ln.endswith("resuming from checkpoint step 2") for ln in err.splitlines()), err
    record = json.loads((tmp_path / "runs/ctrlc/second/run.json").read_text())
    assert record["stages"]["train"]["metrics"]["resumed_from_step"] == 2
    report = (tmp_path / "runs/ctrlc/second/report.html").read_text()
    assert "resumed from step 2" in report
