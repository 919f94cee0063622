"""gpu_check's MoE stage and torch API probe: the grouped-GEMM experts are exercised (and checked
against the per-expert loop) before the GPU run, and the probe reads builtin ops' schemas."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import gpu_check  # noqa: E402
import gpu_check_moe  # noqa: E402


def test_probe_reads_the_grouped_mm_schema():
    assert ("_grouped_mm (MoE experts)", "torch", "_grouped_mm", "offs") in gpu_check.TORCH_APIS
    assert gpu_check._has_keyword(torch._grouped_mm, "offs")
    assert not gpu_check._has_keyword(torch._grouped_mm, "group_sizes")


def test_dry_moe_stage_takes_the_grouped_kernel_and_matches_the_loop():
    result = gpu_check_moe.check(dry=True)
    assert result["grouped_mm"], result  # CPU torch has _grouped_mm: the GPU's path runs here
    assert result["out_rel_err"] <= 1e-5 and result["grad_rel_err"] <= 1e-5, result
    assert "error" not in result
