"""Qwen3 (qk-norm, heads wider than dim / n_heads), Qwen3-MoE (top-k probabilities not
renormalised) and Gemma 3 (its norms, GeGLU, interleaved windows, two RoPE bases, capped
logits) train under dp_shard=2, tp=2 and ep=2 as in one process (fp32, 3 steps)."""

from __future__ import annotations

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import GEMMA3, QWEN3, QWEN3_MOE, train_losses

LAYOUTS = [
    ("dp2-qwen3", {"dp_shard": 2}, QWEN3, {}),
    ("tp2-qwen3", {"tp": 2}, QWEN3, {}),
    ("ep2-qwen3-moe", {"dp_shard": 2, "ep": 2}, QWEN3_MOE, {}),
    ("tp2-qwen3-moe", {"tp": 2}, QWEN3_MOE, {}),
    ("dp2-gemma3", {"dp_shard": 2}, GEMMA3, {}),
    ("tp2-gemma3", {"tp": 2}, GEMMA3, {}),
]


@pytest.mark.slow
def test_qwen3_and_gemma3_layouts_match_single_process():
    losses = train_losses([({}, QWEN3, {}), ({}, QWEN3_MOE, {}), ({}, GEMMA3, {})])
    single = dict(zip(("qwen3", "qwen3-moe", "gemma3"), losses, strict=True))
    per_rank = run_distributed(train_losses, 2, [layout[1:] for layout in LAYOUTS])
    for rank, results in enumerate(per_rank):
        for (name, *_), losses in zip(LAYOUTS, results, strict=True):
            want = single[name.split("-", 1)[1]]
            assert losses == pytest.approx(want, abs=1e-5), (name, rank, losses, want)
