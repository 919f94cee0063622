"""The stage contract: wiring, caching, forced re-runs, resume after SIGKILL, run.json lineage."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln import Pipeline, stage_class
from kiln.platform.errors import ConfigError, SpecError
from tests.platform.stages_for_tests import CountRuns, HangOnce

REPO = Path(__file__).resolve().parents[2]


def _run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_sdk_pipeline_runs_and_second_run_hits_cache(tmp_path, ray_session):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("the quick brown fox")
    (docs / "b.txt").write_text("jumps over the lazy dog the end")
    read, stats = stage_class("text.read"), stage_class("text.stats")

    def pipeline():
        return Pipeline(
            "demo",
            [read(paths=[str(docs)], name="read"), stats(name="stats")],
            runs_dir=tmp_path / "runs",
        )

    first = pipeline().run()
    rec = _run_json(first.run_dir)
    assert rec["status"] == "succeeded"
    assert [rec["stages"][s]["status"] for s in ("read", "stats")] == ["done", "done"]
    stats_json = json.loads((first.run_dir / "stats" / "stats" / "stats.json").read_text())
    assert stats_json["documents"] == 2 and stats_json["words"] == 11
    assert (
        rec["stages"]["stats"]["inputs"]["corpus"]["fingerprint"]
        == rec["stages"]["read"]["fingerprint"]
    )

    second = pipeline().run()
    rec2 = _run_json(second.run_dir)
    assert second.run_dir != first.run_dir
    assert [rec2["stages"][s]["status"] for s in ("read", "stats")] == ["cached", "cached"]
    assert rec2["stages"]["stats"]["fingerprint"] == rec["stages"]["stats"]["fingerprint"]

    (docs / "c.txt").write_text("a new file changes the reader's fingerprint")
    third = pipeline().run()
    rec3 = _run_json(third.run_dir)
    assert [rec3["stages"][s]["status"] for s in ("read", "stats")] == ["done", "done"]
    assert (
        json.loads((third.run_dir / "stats" / "stats" / "stats.json").read_text())["documents"] == 3
    )


def test_force_reruns_one_stage_and_config_change_invalidates(tmp_path):
    log = tmp_path / "log.txt"

    def pipeline(value=1):
        return Pipeline(
            "p",
            [CountRuns(log=str(log), name="a"), CountRuns(log=str(log), value=value, name="b")],
            runs_dir=tmp_path,
        )

    pipeline().run()
    assert log.read_text().split() == ["a", "b"]
    res = pipeline().run(force=["b"])
    assert log.read_text().split() == ["a", "b", "b"]
    assert res.stage_status("a") == "cached" and res.stage_status("b") == "done"
    pipeline(value=2).run()
    assert log.read_text().split() == ["a", "b", "b", "b"]
    with pytest.raises(SpecError, match="--force nope"):
        pipeline().run(force=["nope"])


def test_wiring_errors_name_the_slot(tmp_path):
    with pytest.raises(SpecError, match=r"h\.inputs\.inp: no earlier stage produces a Stats"):
        Pipeline("p", [HangOnce(marker="m", log="l", name="h")], runs_dir=tmp_path)
    with pytest.raises(SpecError, match=r"h\.inputs\.inp: unknown artifact 'x\.out'"):
        Pipeline(
            "p",
            [
                CountRuns(log="l", name="a"),
                HangOnce(marker="m", log="l", name="h", inputs={"inp": "x.out"}),
            ],
            runs_dir=tmp_path,
        )
    with pytest.raises(ConfigError, match=r"a\.value: .*integer"):
        CountRuns(log="l", value="many", name="a")
    with pytest.raises(ConfigError, match=r"a\.colour: unknown field"):
        CountRuns(log="l", colour="red", name="a")


def test_sigkill_in_second_stage_then_rerun_resumes_there(tmp_path):
    log, marker = tmp_path / "log.txt", tmp_path / "marker"
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"""
pipeline: resume
runs_dir: {tmp_path / "runs"}
stages:
  - stage: tests.platform.stages_for_tests:CountRuns
    name: first
    config: {{log: {log}}}
  - stage: tests.platform.stages_for_tests:HangOnce
    name: second
    config: {{log: {log}, marker: {marker}}}
"""
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "kiln", "run", str(spec)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:  # killed on every path: a failed wait must not leave a `kiln run` sleeping in HangOnce
        deadline = time.monotonic() + 240  # a bound only: an early exit fails at once
        while not marker.exists():
            assert proc.poll() is None, "pipeline exited before reaching the second stage"
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert log.read_text().split() == ["first", "second"]
    killed_run = next((tmp_path / "runs" / "resume").iterdir())
    assert _run_json(killed_run)["stages"]["second"]["status"] == "running"

    out = subprocess.run(
        check=False, args=cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert log.read_text().split() == [
        "first",
        "second",
        "second",
    ]  # the first stage was not re-run
    runs = sorted((tmp_path / "runs" / "resume").iterdir())
    rec = _run_json(runs[-1])
    assert rec["stages"]["first"]["status"] == "cached"
    assert rec["stages"]["second"]["status"] == "done"


def test_an_sdk_run_in_a_plain_script_logs_its_stage_lines(tmp_path):
    """No `kiln` CLI, no logging set up (the root logger at Python's default WARNING): the run
    log still gets the stage lines, the script's stderr gets nothing, and the `kiln` logger's
    level is the script's again afterwards."""
    script = f"""
import logging
from kiln import Pipeline
from tests.platform.stages_for_tests import CountRuns
run = Pipeline("plain", [CountRuns(log={str(tmp_path / "log.txt")!r}, name="a")],
               runs_dir={str(tmp_path / "runs")!r}).run()
print("LEVEL", logging.getLogger("kiln").level, "RUN", run.run_dir)
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    level, run_dir = out.stdout.split("LEVEL ")[1].split(" RUN ")
    assert int(level) == logging.NOTSET
    saved = (Path(run_dir.strip()) / "logs" / "kiln.log").read_text()
    assert "stage a: started" in saved and "stage a: done in" in saved, saved
