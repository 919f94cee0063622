"""Stages declare what they need; the platform starts Ray, releases an embedded Ray before a stage
that needs none (unless a non-cacheable stage's effect lives on it), honours the spec's `ray:`
block, checks GPUs, hands stages a work folder and rejects URI runs folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.platform.cli import main
from kiln.platform.errors import ConfigError
from kiln.platform.pipeline import Pipeline
from kiln.platform.runtime import Resources, Runtime
from tests.platform.stages_for_tests import RayProbe

REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.platform.stages_for_tests:RayProbe"
HELD = "tests.platform.stages_for_tests:HeldRayProbe"

SCRIPT = """
import json, sys
from kiln.platform.cli import main
from kiln.platform.pipeline import Pipeline
from kiln.platform.runtime import RayConfig
from tests.platform.stages_for_tests import HeldRayProbe, RayProbe

assert main(["run", "spec.yaml", "--runs-dir", "runs", "--run-id", "cli"]) == 0
held = Pipeline(
    "held",
    [HeldRayProbe(name="serve", needs_ray=True), RayProbe(name="after", needs_ray=False)],
    runs_dir="runs",
    ray=RayConfig(num_cpus=1),
).run(run_id="sdk")
print("HELD", json.dumps(held.record["stages"]["after"]["metrics"]))
"""


@pytest.mark.slow
def test_spec_ray_block_and_release_between_stages(tmp_path):
    """One fresh process (no session Ray): `ray: {num_cpus: 1}` sizes the embedded Ray; a stage
    declaring `ray: false` runs with Ray shut down unless a later stage needs Ray again; after a
    non-cacheable stage it stays up."""
    (tmp_path / "spec.yaml").write_text(
        "pipeline: res\nray: {num_cpus: 1}\nstages:\n"
        f"  - {{stage: '{PROBE}', name: on_ray, config: {{needs_ray: true}}}}\n"
        f"  - {{stage: '{PROBE}', name: undeclared}}\n"
        f"  - {{stage: '{PROBE}', name: kept, config: {{needs_ray: false}}}}\n"
        f"  - {{stage: '{PROBE}', name: again, config: {{needs_ray: true}}}}\n"
        f"  - {{stage: '{PROBE}', name: off_ray, config: {{needs_ray: false}}}}\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    stages = json.loads((tmp_path / "runs/res/cli/run.json").read_text())["stages"]
    assert stages["on_ray"]["metrics"] == {"ray_up": True, "cpus": 1.0}
    assert stages["undeclared"]["metrics"]["ray_up"] is True  # not declared: left as it is
    # `again` needs Ray after it: kept up, not restarted (a fresh start costs ~10 CPU seconds)
    assert stages["kept"]["metrics"] == {"ray_up": True, "cpus": 1.0}
    assert stages["again"]["metrics"] == {"ray_up": True, "cpus": 1.0}
    assert stages["off_ray"]["metrics"] == {"ray_up": False, "cpus": None}
    run_log = (tmp_path / "runs/res/cli/logs/kiln.log").read_text()  # quiet terminal: log only
    assert run_log.count("shutting down the embedded Ray") == 1
    held = json.loads(out.stdout.split("HELD ", 1)[1].splitlines()[0])
    assert held == {"ray_up": True, "cpus": 1.0}


def test_a_no_ray_step_keeps_ray_for_a_later_stage_unless_it_reclaims_the_memory():
    from kiln.curator.config import CurateConfig
    from kiln.curator.pipeline import step_needs

    stops: list[str] = []
    runtime = Runtime()
    runtime.shutdown = lambda: stops.append("stop")
    runtime.ray_later = True
    runtime.provide(Resources(ray=False))
    assert stops == []  # a later stage needs Ray: no stop and restart
    _, dedup_on_threads = step_needs(CurateConfig(input=["x"], cluster="local"))
    runtime.provide(dedup_on_threads)
    assert stops == ["stop"]  # the dedup peak gets Ray's memory all the same
    runtime.ray_later = False
    runtime.provide(Resources(ray=False))
    assert stops == ["stop", "stop"]


def test_ray_block_is_validated(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(
        "pipeline: p\nray: {num_cpu: 2}\nstages:\n  - stage: noop\n"
    )
    assert main(["run", str(tmp_path / "spec.yaml"), "--runs-dir", str(tmp_path)]) == 2
    assert "ray.num_cpu: unknown field" in capsys.readouterr().err
    (tmp_path / "spec.yaml").write_text("pipeline: p\nstages:\n  - stage: noop\n")
    assert main(["run", str(tmp_path / "spec.yaml"), "--set", "ray.num_cpus=0"]) == 2
    err = capsys.readouterr().err  # the --set put the bad value there: it takes the blame
    assert "--set ray.num_cpus=0: Input should be greater than or equal to 1" in err


def test_gpu_need_is_checked_before_the_stage_runs(ray_session, tmp_path):
    probe = RayProbe(name="gpu", needs_ray=True, gpus=1)
    with pytest.raises(ConfigError, match=r"gpu: needs 1 GPUs, the Ray cluster has 0"):
        Pipeline("g", [probe], runs_dir=tmp_path).run(shutdown=False)


def test_uri_runs_dir_is_rejected_not_made_a_local_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text("pipeline: p\nstages:\n  - stage: noop\n")
    assert main(["run", "spec.yaml", "--runs-dir", "s3://bucket/runs"]) == 2
    err = capsys.readouterr().err
    assert "runs_dir s3://bucket/runs: expected a local folder" in err, err
    assert not (tmp_path / "s3:").exists()
    assert (
        main(["submit", "spec.yaml", "--address", "http://127.0.0.1:1", "--runs-dir", "gs://b"])
        == 2
    )
    assert "runs_dir gs://b: expected a local folder" in capsys.readouterr().err


def test_work_dir_survives_a_failure_and_goes_on_success(tmp_path):
    from kiln.platform.stage import Stage, StageContext

    class Flaky(Stage):
        type_name = "flaky"
        output_kinds = {"out": "Stats"}  # noqa: RUF012
        seen: list = []  # noqa: RUF012

        def run(self, ctx: StageContext):
            ctx.work_dir.mkdir(parents=True, exist_ok=True)  # the stage creates what it uses
            Flaky.seen.append((ctx.work_dir, sorted(p.name for p in ctx.work_dir.iterdir())))
            (ctx.work_dir / "progress").write_text("half")
            if len(Flaky.seen) == 1:
                raise RuntimeError("crash")
            return {}

    with pytest.raises(Exception, match="crash"):
        Pipeline("w", [Flaky()], runs_dir=tmp_path).run()
    Pipeline("w", [Flaky()], runs_dir=tmp_path).run()
    (first, files1), (second, files2) = Flaky.seen
    assert first == second and files1 == [] and files2 == ["progress"]  # resumed from it
    assert not second.exists() and not second.parent.exists()  # no empty `.work` left behind
