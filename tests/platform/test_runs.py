"""`kiln runs` lists real runs (newest first) with status, time, stages done and the report;
`kiln runs PIPELINE` narrows it; `kiln report RUN_DIR` writes the page again."""

from __future__ import annotations

import argparse
from typing import ClassVar

import pytest

from kiln.platform.errors import InputError, StageFailed
from kiln.platform.imports import import_object
from kiln.platform.pipeline import Pipeline
from kiln.platform.runs import list_runs
from kiln.platform.runs_cli import register
from kiln.platform.stage import Stage, StageConfig, StageContext


class StepConfig(StageConfig):
    fail: bool = False
    note: int = 0  # a different value: a different fingerprint (no cache hit)


class Step(Stage):
    type_name = "test.step"
    Config = StepConfig
    output_kinds: ClassVar[dict[str, str]] = {"out": "Stats"}

    def run(self, ctx: StageContext):
        if self.config.fail:
            raise RuntimeError("boom")
        return {"ok": 1}


def kiln(argv: list[str]) -> int:
    """`kiln ARGV` for this module's commands (the full CLI imports every area: seconds)."""
    parser = argparse.ArgumentParser(prog="kiln")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return import_object(args.handler)(args)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    Pipeline("alpha", [Step(name="a"), Step(name="b")], runs_dir=root).run(run_id="r1")
    with pytest.raises(StageFailed):
        Pipeline("alpha", [Step(name="a"), Step(name="c", fail=True)], runs_dir=root).run(
            run_id="r2"
        )
    Pipeline("beta", [Step(name="x")], runs_dir=root).run(run_id="r3")
    return root


def test_list_runs_newest_first_with_status_and_stages(runs):
    found = list_runs(runs)
    assert [(r.pipeline, r.run_id, r.status) for r in found] == [
        ("beta", "r3", "succeeded"),
        ("alpha", "r2", "failed"),
        ("alpha", "r1", "succeeded"),
    ]
    r2 = found[1]
    assert (r2.stages_done, r2.stages) == (1, 2)  # a: cached from r1, c: failed
    assert r2.duration_s is not None and r2.duration_s >= 0
    assert all(r.report is not None for r in found)


def test_kiln_runs_command(runs, capsys):
    assert kiln(["runs", "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["PIPELINE", "RUN", "STATUS", "STARTED"]
    assert [ln.split()[:3] for ln in lines[1:]] == [
        ["beta", "r3", "succeeded"],
        ["alpha", "r2", "failed"],
        ["alpha", "r1", "succeeded"],
    ]
    assert lines[2].rstrip().endswith("alpha/r2/report.html")
    assert kiln(["runs", "alpha", "--runs-dir", str(runs), "-n", "1"]) == 0
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines()[1:]] == ["r2"]
    with pytest.raises(InputError, match="no such folder"):
        kiln(["runs", "--runs-dir", str(runs / "nowhere")])


def test_kiln_report_rewrites_the_page(runs, capsys):
    page = runs / "alpha" / "r2" / "report.html"
    page.unlink()
    assert kiln(["report", str(runs / "alpha" / "r2")]) == 0
    assert "boom" in page.read_text() and str(page) in capsys.readouterr().out
    with pytest.raises(InputError, match="not a run folder"):
        kiln(["report", str(runs)])


def test_run_json_records_what_ran(runs, tmp_path):
    import json

    import kiln
    from kiln.platform.provenance import git_state

    record = json.loads((runs / "alpha" / "r2" / "run.json").read_text())
    stages = record["spec"]["stages"]
    assert [(s["stage"], s["name"]) for s in stages] == [("test.step", "a"), ("test.step", "c")]
    assert stages[1]["config"] == {"fail": True, "note": 0}  # every field, defaults too
    assert record["overrides"] == [] and record["spec"]["source"] is None  # built in Python
    assert record["versions"]["kiln"] == kiln.__version__
    assert record["versions"]["torch"] and record["versions"]["ray"]
    assert record["host"]["hostname"] and isinstance(record["host"]["pid"], int)
    assert record["git_sha"] is None or len(record["git_sha"]) == 40
    assert git_state(tmp_path) == {"git_sha": None, "git_dirty": None}  # not a checkout


def test_spec_run_records_resolved_spec_and_overrides(tmp_path):
    import json

    from kiln.platform.spec import load_pipeline

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "pipeline: gamma\nstages:\n"
        "  - {stage: 'tests.platform.test_runs:Step', name: one}\n"
        "  - {stage: 'tests.platform.test_runs:Step', name: two, config: {fail: false}}\n"
    )
    pipeline = load_pipeline(spec, ["two.fail=false", "one.fail=false"], runs_dir=tmp_path / "r")
    result = pipeline.run(run_id="x")
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["overrides"] == ["two.fail=false", "one.fail=false"]
    assert record["spec"]["source"] == str(spec.resolve())
    assert [s["config"] for s in record["spec"]["stages"]] == [{"fail": False, "note": 0}] * 2


def test_runs_rm_refuses_a_running_or_reused_run(runs, capsys):
    import json
    import subprocess
    import sys

    r1, r3 = runs / "alpha" / "r1", runs / "beta" / "r3"
    # r2 reuses r1's stage `a` (cached): r1 stays unless forced
    assert kiln(["runs", "rm", str(r1), "--runs-dir", str(runs)]) == 1
    assert "kept alpha/r1: stages cached from it by alpha/r2" in capsys.readouterr().out
    assert r1.is_dir()
    # a run whose driver is alive (this process) is kept; once its driver is gone it goes
    record = json.loads((r3 / "run.json").read_text())
    (r3 / "run.json").write_text(json.dumps({**record, "status": "running"}))
    assert kiln(["runs", "rm", "beta/r3", "--runs-dir", str(runs)]) == 1
    assert "kept beta/r3: running" in capsys.readouterr().out and r3.is_dir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    record["status"], record["host"]["pid"] = "running", int(dead)
    (r3 / "run.json").write_text(json.dumps(record))
    assert kiln(["runs", "rm", "beta/r3", "--runs-dir", str(runs)]) == 0
    assert "removed beta/r3" in capsys.readouterr().out and not r3.exists()
    assert kiln(["runs", "rm", str(r1), "--force", "--runs-dir", str(runs)]) == 0
    assert not r1.exists()
    with pytest.raises(InputError, match="not a run folder"):
        kiln(["runs", "rm", "alpha/nope", "--runs-dir", str(runs)])


def test_runs_gc_keeps_the_newest_per_pipeline(runs, capsys):
    for i in range(3):
        Pipeline("beta", [Step(name="y", note=i)], runs_dir=runs).run(run_id=f"b{i}")
    assert kiln(["runs", "gc", "--keep", "2", "beta", "--dry-run", "--runs-dir", str(runs)]) == 0
    assert "would remove beta/b0" in capsys.readouterr().out and (runs / "beta" / "b0").is_dir()
    assert kiln(["runs", "gc", "--keep", "1", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "kept alpha/r1: stages cached from it by alpha/r2" in out
    left = sorted(f"{r.pipeline}/{r.run_id}" for r in list_runs(runs))
    assert left == ["alpha/r1", "alpha/r2", "beta/b2"]
