"""Pipelines as Ray jobs on a real local head node: `kiln submit` and plain `ray job submit`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kiln.platform.cli import main
from kiln.platform.jobs import logs, wait
from tests.platform.headnode import BIN, HeadNode

pytestmark = pytest.mark.slow

SPEC = """
pipeline: job
stages:
  - stage: text.read
    name: read
    config: {paths: [docs]}
  - stage: text.stats
    name: stats
"""


def _runs(runs_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs_dir.glob("job/*/run.json"))]


def test_kiln_submit_and_ray_job_submit_both_succeed(tmp_path, capsys):
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "docs" / "a.txt").write_text("one two three")
    (work / "spec.yaml").write_text(SPEC)
    runs = tmp_path / "runs"
    with HeadNode() as head:
        out = subprocess.run(
            check=False,
            args=[
                str(BIN / "kiln"),
                "submit",
                "spec.yaml",
                "--address",
                head.dashboard_url,
                "--wait",
                "--runs-dir",
                str(runs),
            ],
            cwd=work,
            env=head.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "SUCCEEDED" in out.stdout
        job_id = out.stdout.split("submitted job ")[1].split()[0]
        # `kiln status` in this process (its command, not its process start, is under test)
        assert main(["status", job_id, "--address", head.dashboard_url]) == 0
        assert capsys.readouterr().out.strip() == "SUCCEEDED"

        out = subprocess.run(
            check=False,
            args=[
                str(BIN / "ray"),
                "job",
                "submit",
                "--address",
                head.dashboard_url,
                "--working-dir",
                str(work),
                "--submission-id",
                "plain-ray-job",
                "--no-wait",  # its log tail lingers ~6 s after the job ends: poll the status
                "--",
                "python",
                "-m",
                "kiln",
                "run",
                "spec.yaml",
                "--runs-dir",
                str(runs),
                "--force",
                "stats",
            ],
            cwd=work,
            env=head.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        state = wait("plain-ray-job", head.dashboard_url, timeout_s=300, echo=lambda _: None)
        assert state == "SUCCEEDED", logs("plain-ray-job", head.dashboard_url)[-3000:]
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
