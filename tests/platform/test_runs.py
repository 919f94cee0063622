"""`kiln runs` lists real runs (newest first) with status, time, stages done and the report;
`kiln runs PIPELINE` narrows it; `kiln report RUN_DIR` writes the page again."""

from __future__ import annotations

import argparse
from typing import ClassVar

import pytest

from kiln.platform.errors import InputError, StageFailed
from kiln.platform.pipeline import Pipeline
from kiln.platform.runs import list_runs, register
from kiln.platform.stage import Stage, StageConfig, StageContext


class StepConfig(StageConfig):
    fail: bool = False


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
    return args.func(args)


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
