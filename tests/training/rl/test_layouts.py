"""GRPO with the policy under FSDP2 (dp_shard=2: each rank scores half the batch) and tensor
parallelism (tp=2) equals one process (full fine-tuning; LoRA with a KL to the base and two
passes per batch; sampled ahead): rewards and losses step for step (<= 1e-5 over 3 steps), the
engine's log-probs within 1e-5 of the laid-out trainer's, and after every refit the engine
holds the trainer's gathered weights."""

import os

import pytest

from kiln.engine.generator import Generator
from kiln.platform.errors import ConfigError
from kiln.training.config import ParallelConfig
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.layouts import shard_policy
from kiln.training.rl.run import run_grpo
from tests.training.distributed import run_distributed
from tests.training.rl._layout_cases import (
    distill_layout_vs_single,
    grpo_layout_vs_single,
    torchrun_entry_vs_single,
)
from tests.training.rl.test_distill_cli import _models
from tests.training.rl.test_grpo import _loop

STEPS = 3


LORA_KL = {"lora": {"rank": 4, "alpha": 8}, "beta": 0.04, "num_iterations": 2}


@pytest.mark.parametrize(
    "parallel,overrides",
    [
        ({"dp_shard": 2}, {}),
        ({"tp": 2}, {}),
        ({"dp_shard": 2}, LORA_KL),
        ({"tp": 2}, LORA_KL),
        ({"dp_shard": 2}, {"max_policy_lag": 1}),
    ],
    ids=["fsdp", "tp", "fsdp-lora-kl", "tp-lora-kl", "fsdp-async"],
)
def test_grpo_under_a_layout_equals_one_process(parallel, overrides):
    for laid_out, single in run_distributed(grpo_layout_vs_single, 2, parallel, STEPS, overrides):
        assert len(laid_out) == len(single) == STEPS
        for (reward, loss, mismatch, match, scored), (reward1, loss1, mismatch1, _, whole) in zip(
            laid_out, single, strict=True
        ):
            # FSDP2's ranks score half the completions each, TP's all of them together
            assert scored == (whole // 2 if "dp_shard" in parallel else whole)
            assert reward == pytest.approx(reward1, abs=1e-5)
            assert loss == pytest.approx(loss1, abs=1e-5)
            # the engine (gathered weights) vs the laid-out trainer: as in one process, where
            # sampled ahead that also holds the policy's change over one update (several nats:
            # the layouts' updates agree to rounding, so relative)
            assert mismatch == pytest.approx(mismatch1, abs=1e-5, rel=1e-5)
            assert mismatch < 1e-5 or overrides.get("max_policy_lag")
            assert match  # engine checksum == the trainer's gathered weights


def test_layouts_the_loop_cannot_take_are_config_errors():
    loop = _loop(steps=1)
    with pytest.raises(ConfigError, match="^parallel: on-policy loops take dp_shard and tp"):
        shard_policy(loop, ParallelConfig(pp=2), 2)


def test_torchrun_entry_point_writes_the_one_process_run(tmp_path):
    """`torchrun -m kiln.training.rl.run` with `parallel: {dp_shard: 2}`: rank 0 writes the
    Checkpoint and run.json, whose steps equal the run in one process."""
    _, prompts = _models(tmp_path)
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"grpo:\n  base: {tmp_path / 'student'}\n  prompts: {prompts}\n  prompt_format: raw\n"
        "  rewards: [{name: regex, params: {pattern: 'o'}}]\n  steps: 3\n  group_size: 4\n"
        "  prompts_per_step: 2\n  max_new_tokens: 5\n  optimizer: {lr: 0.03, weight_decay: 0.0}\n"
        "  parallel: {dp_shard: 2}\n"
    )
    out = str(tmp_path / "out")
    first, second = run_distributed(torchrun_entry_vs_single, 2, str(config), out)
    assert second is None
    laid_out, single = first
    assert [m["reward"] for m in laid_out] == pytest.approx([m["reward"] for m in single], abs=1e-5)
    assert [m["loss"] for m in laid_out] == pytest.approx([m["loss"] for m in single], abs=1e-5)
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    assert Generator.load(out).model.cfg.vocab_size > 0  # a Checkpoint export/serve read


def test_a_layout_without_its_ranks_is_a_config_error(tmp_path):
    _, prompts = _models(tmp_path)
    cfg = GRPORunConfig(
        base=str(tmp_path / "student"),
        prompts=str(prompts),
        rewards=[{"name": "regex", "params": {"pattern": "o"}}],
        steps=1,
        parallel={"dp_shard": 2},
    )
    with pytest.raises(ConfigError, match="^parallel: a layout needs its ranks: launch with"):
        run_grpo(cfg, str(tmp_path / "out"))


@pytest.mark.parametrize("parallel", [{"dp_shard": 2}, {"tp": 2}], ids=["fsdp", "tp"])
def test_on_policy_distillation_under_a_layout_equals_one_process(parallel):
    for laid_out, single in run_distributed(distill_layout_vs_single, 2, parallel, STEPS):
        for (kl, loss, mismatch, match), (kl1, loss1, _, _) in zip(laid_out, single, strict=True):
            assert kl == pytest.approx(kl1, abs=1e-5) and loss == pytest.approx(loss1, abs=1e-5)
            assert mismatch < 1e-5 and match
