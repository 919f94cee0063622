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
    distill_evaluate_vs_single,
    distill_layout_vs_single,
    grpo_layout_vs_single,
    grpo_resumed_vs_straight,
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
        for (reward, loss, mismatch, match, scored, sampled), (
            reward1,
            loss1,
            mismatch1,
            _,
            whole,
            _,
        ) in zip(laid_out, single, strict=True):
            # FSDP2's ranks score half the completions each, TP's all of them together; under
            # both each rank's engine samples half the batch (the other half all-gathered)
            assert scored == (whole // 2 if "dp_shard" in parallel else whole)
            assert sampled == whole // 2
            assert reward == pytest.approx(reward1, abs=1e-5)
            assert loss == pytest.approx(loss1, abs=1e-5)
            # the engine (gathered weights) vs the laid-out trainer: as in one process, where
            # sampled ahead that also holds the policy's change over one update (a log-prob
            # gap of ~4, which the engine's half-batch decode rounds ~1e-5 differently from
            # the whole batch's: fp32, relative 3e-6)
            assert mismatch == pytest.approx(mismatch1, rel=1e-5, abs=1e-5)
            assert mismatch < 1e-5 or overrides.get("max_policy_lag")
            assert match  # engine checksum == the trainer's gathered weights


def test_layouts_the_loop_cannot_take_are_config_errors():
    loop = _loop(steps=1)
    for dim in ("pp", "cp", "ep", "dp_replicate"):
        with pytest.raises(ConfigError, match=f"^parallel.{dim}=2: on-policy loops take dp_shard"):
            shard_policy(loop, ParallelConfig(**{dim: 2}), 2)
    heads = loop.policy.cfg.n_heads
    with pytest.raises(ConfigError, match=rf"^grpo.parallel.tp={heads + 1} must divide the model"):
        shard_policy(loop, ParallelConfig(tp=heads + 1), heads + 1, "grpo.parallel")


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
    with pytest.raises(ConfigError, match="^grpo.parallel: a layout needs its ranks: run it"):
        run_grpo(cfg, str(tmp_path / "out"))


@pytest.mark.parametrize(
    "parallel,divergence",
    [
        ({"dp_shard": 2}, "reverse_kl"),
        ({"dp_shard": 2}, "forward_kl"),
        ({"dp_shard": 2}, "jsd"),
        ({"tp": 2}, "reverse_kl"),
    ],
    ids=["fsdp", "fsdp-forward-kl", "fsdp-jsd", "tp"],
)
def test_on_policy_distillation_under_a_layout_equals_one_process(parallel, divergence):
    """FSDP2's ranks each score half of every batch, with the teacher and the student, and
    still equal one process; TP's ranks score all of it together."""
    ranks = run_distributed(
        distill_layout_vs_single, 2, parallel, STEPS, {"divergence": divergence}
    )
    for laid_out, single in ranks:
        assert len(laid_out) == len(single) == STEPS
        for (kl, loss, mismatch, match, scored, most), (kl1, loss1, _, _, whole, most1) in zip(
            laid_out, single, strict=True
        ):
            assert kl == pytest.approx(kl1, abs=1e-5) and loss == pytest.approx(loss1, abs=1e-5)
            assert mismatch < 1e-5 and match
            # 3 prompts x 2 completions a step; one process's teacher scores all 6
            assert whole == most1 == 6
            half = "dp_shard" in parallel
            assert scored == most == (whole // 2 if half else whole)
        assert laid_out[0][1] != laid_out[-1][1]  # the steps differ: a real comparison


def test_held_out_distillation_score_splits_over_dp_shard_ranks():
    """The held-out reverse KL (run.json's before/after): each rank's teacher scores half the
    held-out completions, and the reduced mean is one process's."""
    for (score, scored), (score1, whole) in run_distributed(
        distill_evaluate_vs_single, 2, {"dp_shard": 2}
    ):
        assert score == pytest.approx(score1, abs=1e-5) and score1 > 0
        assert (scored, whole) == (2, 4)  # 4 held-out prompts, one completion each


@pytest.mark.parametrize(
    "parallel,overrides", [({"dp_shard": 2}, LORA_KL), ({"tp": 2}, {})], ids=["fsdp-lora", "tp"]
)
def test_a_laid_out_run_resumes_exactly(tmp_path, parallel, overrides):
    """Rank 0 writes the gathered policy and AdamW state (loop_state.py); every rank loads it
    back into its shards, so the resumed run repeats the straight one's rewards and losses."""
    _, prompts = _models(tmp_path)
    fields = {
        "base": str(tmp_path / "student"),
        "prompts": str(prompts),
        "prompt_format": "raw",
        "rewards": [{"name": "regex", "params": {"pattern": "o"}}],
        "steps": 4,
        "group_size": 4,
        "prompts_per_step": 2,
        "max_new_tokens": 5,
        "optimizer": {"lr": 0.03, "weight_decay": 0.0},
        "checkpoint_interval": 1,
        "parallel": parallel,
        **overrides,
    }
    straight, resumed, ran = run_distributed(grpo_resumed_vs_straight, 2, fields, str(tmp_path))[0]
    assert ran == [3, 4] and len(resumed) == 4  # only the steps after the saved state ran
    assert [m["reward"] for m in resumed] == [m["reward"] for m in straight]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in straight]
    assert len({m["reward"] for m in straight}) > 1  # the steps differ: a real comparison
