"""A tp=2 checkpoint of each new architecture (Llama 3.2, Qwen3, Qwen3-MoE, Gemma 3, DeepSeek-V3
with its router bias moving every step) resumes at dp_shard=2 with the next step's loss the tp=2
run itself had (fp32, one 2-rank launch for all)."""

from __future__ import annotations

import os

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import (
    DEEPSEEK,
    GEMMA3,
    LLAMA32,
    QWEN3,
    QWEN3_MOE,
    STEPS,
    train_config,
)

ARCHITECTURES = {
    "llama3.2": LLAMA32,
    "qwen3": QWEN3,
    "qwen3_moe": QWEN3_MOE,
    "gemma3": GEMMA3,
    "deepseek_v3": DEEPSEEK,
}
SAVE_AT = STEPS - 1  # one step continued after the checkpoint


def save_at_tp2_resume_at_dp2(root: str) -> dict[str, tuple[list[float], list[float], int]]:
    """Per architecture: (tp=2 losses after SAVE_AT, dp_shard=2 losses resumed, resumed step)."""
    from kiln.training.trainer import Trainer

    out = {}
    for name, model in ARCHITECTURES.items():
        ckpt_dir = os.path.join(root, name)
        save = {"dir": ckpt_dir, "interval_steps": SAVE_AT, "save_final": False}
        saved = Trainer(train_config({"tp": 2}, model, checkpoint=save)).train()
        load = {"load_from": os.path.join(ckpt_dir, f"step-{SAVE_AT:08d}")}
        resumed = Trainer(train_config({"dp_shard": 2}, model, checkpoint=load)).setup()
        step = resumed.step
        losses = [m["loss"] for m in resumed.train()]
        out[name] = ([m["loss"] for m in saved][SAVE_AT:], losses, step)
    return out


@pytest.mark.slow
def test_tp2_checkpoint_resumes_at_dp_shard2_with_the_same_next_loss(tmp_path):
    per_rank = run_distributed(save_at_tp2_resume_at_dp2, 2, str(tmp_path))
    for rank, results in enumerate(per_rank):
        assert sorted(results) == sorted(ARCHITECTURES)
        for name, (continued, resumed, step) in results.items():
            assert step == SAVE_AT, (name, rank)
            assert len(resumed) == len(continued) == STEPS - SAVE_AT, (name, rank)
            assert resumed == pytest.approx(continued, abs=1e-5), (name, rank, resumed, continued)
