"""`bench/gpu_check.sh --dry` on CPU, in a venv holding only the GPU image's packages (numpy 2,
pandas, scipy, numba, pytest..., torch linked from this venv; no Ray, dask or pydantic outside the
carried wheels): the carried wheels install as on the GPU, every stage runs up to its first CUDA
call with its rules, and pytest collects every `-m gpu` test of the suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BENCH = REPO / "bench"


def _missing_host_wheels() -> list[str]:
    """The pinned wheels of bench/gpu_wheels.txt that bench/.gpu-wheels-host lacks."""
    missing = []
    for line in (BENCH / "gpu_wheels.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            pattern = f"{name.replace('-', '_')}-{version}-*.whl"
            if not list((BENCH / ".gpu-wheels-host").glob(pattern)):
                missing.append(name)
    return missing


def _offline_reason() -> str | None:
    """Why the rehearsal cannot be built without PyPI here, or None."""
    if not (BENCH / ".gpu-wheels-host").is_dir():
        return "no bench/.gpu-wheels-host: run `bash bench/gpu_check.sh --fetch-wheels` once"
    missing = _missing_host_wheels()
    if missing:  # fetched before bench/gpu_wheels.txt grew
        return f"bench/.gpu-wheels-host lacks {', '.join(missing)}: run --fetch-wheels again"
    if (
        not (BENCH / ".gpu-dry-venv" / ".kiln-stamp").is_file()
        and not (BENCH / ".gpu-image-wheels").is_dir()
    ):
        return "no image-like venv and no bench/.gpu-image-wheels: run --fetch-wheels once"
    return None


def _gpu_marked_tests() -> int:
    """`-m gpu` tests of the modules that carry the marker, as this venv collects them: the
    image-like venv must collect as many (a module-level importorskip would hide some)."""
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py"))
    marked = [m for m in modules if "pytest.mark.gpu" in (REPO / m).read_text()]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p"]
        + ["no:cacheprovider", *marked],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return int(re.search(r"(\d+)/\d+ tests collected", run.stdout).group(1))


def _dry_run(out: Path, **env: str) -> subprocess.CompletedProcess:
    reason = _offline_reason()
    if reason:
        pytest.skip(reason)
    return subprocess.run(
        ["bash", "bench/gpu_check.sh", "--dry"],
        cwd=REPO,
        env={
            "PATH": os.environ["PATH"],
            "OUT": str(out),
            "PYTHON": sys.executable,
            "PIP_NO_INDEX": "1",  # the suite needs no network: the folders above or nothing
            **env,
        },
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow  # a fresh interpreter importing torch: the check that runs without the venv
def test_kiln_training_imports_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None; "
        "import kiln.training.trainer, kiln.training.torchrun_main, kiln.training.checkpoint"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)


@pytest.mark.slow  # the image-like venv's interpreter records each stage (~10 s)
def test_stages_past_the_global_deadline_are_skipped_and_fail_the_gate(tmp_path):
    run = _dry_run(tmp_path, KILN_GPU_DEADLINE_S="1")
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert stages["bench"] == {"status": "skipped", "error": "global deadline"}
    assert stages["pytest"]["status"] == "skipped"


@pytest.mark.slow  # every stage's CPU part in the image-like venv: 39 s at load 4, 196 s at 21
def test_gpu_check_dry_runs_every_stage_up_to_cuda(tmp_path):
    run = _dry_run(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    names = ["env", "wheels", "imports", "bench", "parity", "learn", "torchrun_accum8"]
    names += ["moe_grouped_mm", "pytest"]
    assert {name: stages[name]["status"] for name in names} == dict.fromkeys(names, "ok")
    assert stages["imports"]["pydantic_from"].endswith("/site/pydantic")  # the carried wheel
    assert all(stages["imports"]["torch_apis"].values()), stages["imports"]["torch_apis"]
    assert len(stages["bench"]["planned"]) >= 6 and stages["bench"]["tiny_cpu"]["loss"] > 0
    single = stages["parity"]["single"]
    assert stages["parity"]["shard"] == pytest.approx(single, rel=1e-3)
    assert stages["learn"]["last_loss"] < 0.75 * stages["learn"]["first_loss"]
    assert stages["torchrun_accum8"]["steps"] == 1
    moe = stages["moe_grouped_mm"]  # this CPU torch has the grouped kernel: it is exercised
    assert moe["grouped_mm"] and moe["out_rel_err"] <= moe["tolerance"], moe
    # every gpu-marked test of the suite imports in the image's package set
    assert stages["pytest"]["tests"] == _gpu_marked_tests() > 0
