"""`kiln run` stops within 10 s of SIGINT, shutting its embedded Ray down and saying so, even when
it inherited SIGINT ignored (as from a non-interactive shell's `cmd &`)."""

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
    assert record["status"] == "failed" and record["stages"]["noop"]["status"] == "done"
