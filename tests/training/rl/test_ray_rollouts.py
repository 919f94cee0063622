"""Rollouts on Ray actors: the same rollouts as in-process (seeds travel with each shard), refit
through the object store with every actor's weights checked against the trainer's, and a killed
actor replaced with its share sampled again."""

import math

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


def _versions(loop: GRPO) -> list[set[int]]:
    """Each step's rollout versions, as the engines stamped them (kept by the step's callback)."""
    return loop.seen_versions


def _keep_versions(loop: GRPO, also=None):
    loop.seen_versions = []

    def on_step(m):
        loop.seen_versions.append({r.policy_version for r in loop.last_update.rollouts})
        if also is not None:
            also(m)

    return on_step


def test_async_on_actors_equals_async_in_process(ray_session):
    local = _loop(0, max_policy_lag=1, steps=4)
    expected = local.run()
    loop = _loop(2, max_policy_lag=1, steps=4)
    try:
        metrics = loop.run(on_step=_keep_versions(loop))
    finally:
        loop.close()
    # the actors stamp each batch with the weights they held: one update behind the trainer
    assert _versions(loop) == [{0}, {0}, {1}, {2}]
    assert [m["policy_lag"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    assert [m["reward"] for m in metrics] == [m["reward"] for m in expected]
    for ours, theirs in zip(metrics, expected, strict=True):
        assert abs(ours["loss"] - theirs["loss"]) < 1e-5
        # a ratio of a stale policy is exp(a log-prob gap of several nats): compare the gaps.
        # The actors' engines sit ~6e-7 from the trainer's log-probs (the in-process one at 0),
        # and the two runs' updates drift apart by that much a step: 3e-5 over four steps.
        assert abs(math.log(ours["is_ratio_max"]) - math.log(theirs["is_ratio_max"])) < 3e-5


def test_async_actor_killed_between_steps_is_replaced_once(ray_session):
    """Killed after a refit, the actor's next batch was already sent to it: the next refit
    replaces it, and that batch goes to the successor without a second replacement."""
    loop = _loop(1, max_policy_lag=1, steps=4)

    def kill(m):
        if m["step"] == 2:
            ray.kill(loop.rollouts.workers[0], no_restart=True)

    try:
        metrics = loop.run(on_step=_keep_versions(loop, also=kill))
        assert _engines_equal_trainer(loop)
    finally:
        loop.close()
    assert loop.rollouts.restarts == 1 and metrics[-1]["rollout_restarts"] == 1
    # the batch lost with the actor was sampled again by its successor, built from the newest
    # weights: the last step's rollouts are fresher than the lag allows, never staler
    assert _versions(loop) == [{0}, {0}, {1}, {3}]
    assert [m["policy_lag"] for m in metrics] == [0.0, 1.0, 1.0, 0.0]
