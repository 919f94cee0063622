"""Rollouts on Ray actors: the same rollouts as in-process (seeds travel with each shard), refit
through the object store with every actor's weights checked against the trainer's, and a killed
actor replaced with its share sampled again."""

import ray
import torch

from kiln.training.rl.config import GRPOConfig
from kiln.training.rl.grpo import GRPO
from kiln.training.rl.refit import merged_policy_state, state_checksum
from tests.engine.tiny import tiny_model, train_tokenizer
from tests.training.rl.test_grpo import share_of_target

ROWS = [{"prompt": p} for p in ("the quick", "hello world", "kiln turns", "ray serve")]


def _loop(workers: int, **overrides) -> GRPO:
    tok = train_tokenizer()
    policy = tiny_model("llama", tok.get_vocab_size(), seed=1)
    with torch.no_grad():
        policy.output.weight.mul_(0.3)
    fields = {
        "rewards": [{"function": f"{share_of_target.__module__}:share_of_target"}],
        "steps": 3,
        "prompts_per_step": 3,
        "group_size": 4,
        "max_new_tokens": 6,
        "prompt_format": "raw",
        "optimizer": {"lr": 1e-1, "weight_decay": 0.0},
        "rollout": {"workers": workers, "cpus_per_worker": 0.25},
    }
    cfg = GRPOConfig(**{**fields, **overrides})
    return GRPO(policy, tok, ROWS, cfg, eos_token_ids=[0])


def _engines_equal_trainer(loop: GRPO) -> bool:
    state = merged_policy_state(loop.policy)
    trainer = state_checksum(state, loop.rollouts.engine_names())
    return loop.rollouts.checksums() == [trainer] * len(loop.rollouts.workers)


def test_two_actors_equal_in_process_and_survive_a_killed_actor(ray_session):
    local = _loop(0).run()
    loop = _loop(2)
    try:
        killed = []

        def kill_one(m):
            assert _engines_equal_trainer(loop)  # after each update, both actors hold it
            if m["step"] == 1:
                killed.append(loop.rollouts.workers[0])
                ray.kill(loop.rollouts.workers[0], no_restart=True)

        metrics = loop.run(on_step=kill_one)
        assert loop.rollouts.restarts >= 1 and killed[0] not in loop.rollouts.workers
        assert metrics[-1]["rollout_restarts"] >= 1
    finally:
        loop.close()
    # the killed actor's share was sampled again: nothing lost, every step as in-process
    assert [m["reward"] for m in metrics] == [m["reward"] for m in local]
    assert [m["completion_len"] for m in metrics] == [m["completion_len"] for m in local]
    for ours, theirs in zip(metrics, local, strict=True):
        assert abs(ours["loss"] - theirs["loss"]) < 1e-5
    assert all(m["refit_verified"] == 1.0 and m["refit_s"] > 0 for m in metrics)


def test_lora_refit_reaches_the_actors_merged(ray_session):
    loop = _loop(1, lora={"rank": 4, "alpha": 8}, steps=2)  # one actor: the refit path is the same
    try:
        before = loop.rollouts.checksums()
        loop.run(on_step=lambda m: None)
        assert _engines_equal_trainer(loop)
        assert loop.rollouts.checksums() != before  # the merged adapters moved the weights
        base = {k: v for k, v in loop.policy.state_dict().items() if "lora" not in k}
        assert state_checksum(base, loop.rollouts.engine_names()) not in loop.rollouts.checksums()
    finally:
        loop.close()
