"""Resuming an on-policy loop is exact on CPU: a run stopped after step 2 and started again from
its saved state repeats the rewards and losses of an uninterrupted run (GRPO with LoRA and a KL
to the base; the same at max_policy_lag 1; on-policy distillation with full fine-tuning)."""

import json

import pytest

from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.distill_config import DistillRunConfig
from kiln.training.rl.distill_run import run_distill
from kiln.training.rl.run import run_grpo
from tests.training.rl.test_distill_cli import _models

STOP_AFTER = 2


class Stop(Exception):
    pass


def _stop_after(step: int):
    def on_step(m):
        if m["step"] == step:
            raise Stop

    return on_step


def _common(tmp_path, prompts):
    return {
        "base": str(tmp_path / "student"),
        "prompts": str(prompts),
        "prompt_format": "raw",
        "steps": 4,
        "prompts_per_step": 2,
        "max_new_tokens": 5,
        "optimizer": {"lr": 0.03, "weight_decay": 0.0},
        "checkpoint_interval": 1,
    }


def _resumed_equals_straight(run, cfg, tmp_path, key):
    straight = run(cfg, str(tmp_path / "straight"))["metrics"]
    out, state = str(tmp_path / "resumed"), str(tmp_path / "state")
    with pytest.raises(Stop):
        run(cfg, out, on_step=_stop_after(STOP_AFTER), state_dir=state)
    ran = []
    resumed = run(cfg, out, on_step=lambda m: ran.append(m["step"]), state_dir=state)["metrics"]
    assert ran == [3, 4] and len(resumed) == 4  # only the steps after the saved state ran
    assert [m[key] for m in resumed] == [m[key] for m in straight]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in straight]
    return json.loads((tmp_path / "resumed" / "run.json").read_text())


def test_grpo_resumes_with_identical_rewards_and_losses(tmp_path):
    _, prompts = _models(tmp_path)
    cfg = GRPORunConfig(
        **_common(tmp_path, prompts),
        rewards=[{"name": "regex", "params": {"pattern": "o"}}],
        group_size=4,
        lora={"rank": 4, "alpha": 8},
        beta=0.05,
    )
    _resumed_equals_straight(run_grpo, cfg, tmp_path, "reward")


def test_distill_resumes_with_identical_losses(tmp_path):
    _, prompts = _models(tmp_path)
    cfg = DistillRunConfig(**_common(tmp_path, prompts), teacher=str(tmp_path / "teacher"))
    run = _resumed_equals_straight(run_distill, cfg, tmp_path, "reverse_kl")
    assert run["steps"] == 4
    assert not (tmp_path / "straight" / "resume").exists()  # removed once the run succeeded


def test_async_grpo_resumes_with_the_batches_sampled_ahead(tmp_path):
    """At max_policy_lag 1 the saved state holds the next step's batch, sampled by the weights
    before the save: the resumed run trains on those same rollouts."""
    _, prompts = _models(tmp_path)
    cfg = GRPORunConfig(
        **_common(tmp_path, prompts),
        rewards=[{"name": "regex", "params": {"pattern": "o"}}],
        group_size=4,
        max_policy_lag=1,
    )
    run = _resumed_equals_straight(run_grpo, cfg, tmp_path, "reward")
    assert [m["policy_lag"] for m in run["metrics"]] == [0.0, 1.0, 1.0, 1.0]
