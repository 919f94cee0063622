"""`bench/gpu_check.sh --dry` on CPU: the carried wheels install into a scratch --target for the
GPU image's Python, kiln.training imports and trains with Ray unimportable, the MoE layer's
grouped GEMM agrees with its loop, torchrun starts, the GPU tests collect, every benchmark config
validates; the JSON has every stage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WHEELS = REPO / "bench" / ".gpu-wheels"


@pytest.mark.slow  # a fresh interpreter importing torch: `make test` only
def test_kiln_training_imports_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None; "
        "import kiln.training.trainer, kiln.training.torchrun_main, kiln.training.checkpoint"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=300)


@pytest.mark.slow
def test_gpu_check_dry_runs_every_stage_up_to_cuda(tmp_path):
    if not WHEELS.is_dir():
        pytest.skip("no bench/.gpu-wheels: run `bash bench/gpu_check.sh --fetch-wheels` once")
    run = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--dry"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    ok = ["env", "wheels", "imports", "cpu_step", "moe_grouped_mm", "torchrun_accum8", "pytest"]
    assert {name: stages[name]["status"] for name in ok} == dict.fromkeys(ok, "ok")
    assert stages["bench"]["status"] == "skipped" and len(stages["bench"]["planned"]) >= 4
    assert all(stages["imports"]["torch_apis"].values()), stages["imports"]["torch_apis"]
    assert stages["torchrun_accum8"]["steps"] == 1
    moe = stages["moe_grouped_mm"]  # this CPU torch has the grouped kernel: it is exercised
    assert moe["grouped_mm"] and moe["out_rel_err"] <= moe["tolerance"], moe
