"""Pipelines as Ray jobs on a real cluster (the suite's 2-node one, tests/two_nodes.py): `kiln
submit` and plain `ray job submit`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kiln.platform.cli import main
from kiln.platform.jobs import logs, wait

BIN = Path(sys.executable).parent

SPEC = """
pipeline: job
stages:
  - stage: text.read
    name: read
    config: {paths: [DOCS]}
  - stage: text.stats
    name: stats
"""


def _runs(runs_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs_dir.glob("job/*/run.json"))]


def _succeeds(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a client command (`kiln submit`, `ray job submit`) and check it exited 0."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["RAY_ADDRESS"] = ""  # the dashboard address is given: no driver attaches here
    out = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_kiln_submit_and_ray_job_submit_both_succeed(two_nodes, tmp_path, capsys):
    work, docs = tmp_path / "work", tmp_path / "docs"
    work.mkdir()
    docs.mkdir()
    (docs / "a.txt").write_text("one two three")
    # an absolute input: each job reads its own copy of the uploaded working folder, on
    # whichever node it runs, and the second job must find the first's output by its inputs
    (work / "spec.yaml").write_text(SPEC.replace("DOCS", str(docs)))
    runs = tmp_path / "runs"
    python = str(two_nodes.loopback_python(tmp_path))  # the jobs' `python` (cluster.py says why)
    address = two_nodes.dashboard_url
    submit = ["submit", "spec.yaml", "--address", address, "--wait", "--runs-dir", str(runs)]
    out = _succeeds([str(BIN / "kiln"), *submit, "--python", python], work)
    assert "SUCCEEDED" in out.stdout
    job_id = out.stdout.split("submitted job ")[1].split()[0]
    # `kiln status` in this process (its command, not its process start, is under test)
    assert main(["status", job_id, "--address", address]) == 0
    assert capsys.readouterr().out.strip() == "SUCCEEDED"

    run_again = ["-m", "kiln", "run", "spec.yaml", "--runs-dir", str(runs), "--force", "stats"]
    _succeeds(
        [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(work)]
        + ["--submission-id", "plain-ray-job"]
        + ["--no-wait"]  # its log tail lingers ~6 s after the job ends: poll the status
        + ["--", python, *run_again],
        work,
    )
    state = wait("plain-ray-job", address, timeout_s=300, echo=lambda _: None)
    assert state == "SUCCEEDED", logs("plain-ray-job", address)[-3000:]
    records = _runs(runs)
    assert len(records) == 2 and all(r["status"] == "succeeded" for r in records)
    assert records[0]["stages"]["stats"]["status"] == "done"
    assert (
        records[1]["stages"]["read"]["status"] == "cached"
    )  # the second job reused the first's output
    assert records[1]["stages"]["stats"]["status"] == "done"
    stats = json.loads(
        Path(records[1]["stages"]["stats"]["outputs"]["stats"]["uri"], "stats.json").read_text()
    )
    assert stats["words"] == 3
