"""Rollouts on Ray actors: the same rollouts as in-process (seeds travel with each shard), refit
through the object store with every actor's weights checked against the trainer's, and a killed
actor replaced with its share sampled again. In the default (batch-invariant) mode an actor's
sampling log-probs are the trainer's bit for bit, as the in-process engine's are, so a run on
actors equals the run in-process exactly, step for step."""

import ray
import torch

from kiln.engine.sampler import SamplingParams
from kiln.training.rl.config import GRPOConfig
from kiln.training.rl.grpo import GRPO
from kiln.training.rl.logprobs import completion_logprobs
from kiln.training.rl.ray_rollouts import RolloutWorker
from kiln.training.rl.refit import merged_policy_state, state_checksum, to_wire
from tests.engine.tiny import tiny_model, train_tokenizer
from tests.training.rl.test_distill import _loop as distill_loop
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


# a step's figures that do not depend on the clock: equal, bit for bit, wherever the rollouts ran
SAME = (
    "reward",
    "reward_std",
    "completion_len",
    "loss",
    "kl",
    "clip_fraction",
    "entropy",
    "grad_norm",
    "logprob_mismatch_mean",
    "logprob_mismatch_max",
    "is_ratio_mean",
    "is_ratio_max",
)


def _same_steps(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for key in SAME:
        assert [m[key] for m in ours] == [m[key] for m in theirs], key


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
    # the killed actor's share was sampled again: nothing lost, every step as in-process, and
    # the actors' log-probs (the first weights, refit ones, a replacement's) are the trainer's
    _same_steps(metrics, local)
    assert all(m["logprob_mismatch_max"] == 0.0 for m in metrics)
    assert all(m["refit_verified"] == 1.0 and m["refit_s"] > 0 for m in metrics)


def test_lora_refit_reaches_the_actors_merged(ray_session):
    lora = {"rank": 4, "alpha": 8}
    local = _loop(0, lora=lora, steps=2).run()
    loop = _loop(1, lora=lora, steps=2)  # one actor: the refit path is the same
    try:
        before = loop.rollouts.checksums()
        metrics = loop.run(on_step=lambda m: None)
        assert _engines_equal_trainer(loop)
        assert loop.rollouts.checksums() != before  # the merged adapters moved the weights
        base = {k: v for k, v in loop.policy.state_dict().items() if "lora" not in k}
        assert state_checksum(base, loop.rollouts.engine_names()) not in loop.rollouts.checksums()
    finally:
        loop.close()
    # the first step's adapters are zero: the engine's log-probs are the trainer's exactly. Once
    # trained, the trainer adds B(Ax) where the engines multiply by W + BA: ~1e-6 apart, in
    # process too, and the actor's figures are the in-process engine's bit for bit
    assert metrics[0]["logprob_mismatch_max"] == 0.0
    assert 0.0 < metrics[1]["logprob_mismatch_max"] < 1e-5
    _same_steps(metrics, local)


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
    # stale batches' log-probs (and their ratios) are the in-process engine's exactly: the
    # actors compute them as it does, so the two runs never drift apart
    assert max(m["logprob_mismatch_max"] for m in metrics) > 0.1  # a lagging policy's gap
    _same_steps(metrics, expected)


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


def test_worker_engine_keeps_the_trainers_attention_backend():
    """The actor's body, in this process: its engine is built from the wire weights and a config
    (build_model puts models on SDPA) and must run the trainer's batch-invariant attention, or
    its log-probs sit ~1e-6 from the trainer's (issue 36). No Ray needed."""
    loop = _loop(0, steps=1)  # the loop switched the policy to the invariant backend
    policy = loop.policy.eval()
    tok = loop.tokenizer
    worker = RolloutWorker(
        policy.cfg.model_dump(mode="json"),
        to_wire(merged_policy_state(policy)),
        tok.to_str(),
        [0],
        max_batch_size=8,
        dtype="float32",
    )
    loop.close()
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    rollouts = worker.generate([tok.encode(r["prompt"]).ids for r in ROWS], 4, params, seed=3)
    with torch.no_grad():
        scores = completion_logprobs(
            policy, [r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], 1.0
        )
    for i, r in enumerate(rollouts):
        trainer = scores.logp[i, : len(r.logprobs)].tolist()
        assert r.logprobs == trainer, i


def test_distill_on_an_actor_equals_in_process(ray_session):
    """On-policy distillation samples through the same actors: the student's log-probs on the
    actor are the trainer's exactly, and the run is the in-process run step for step."""
    local = distill_loop(steps=3).run()
    loop = distill_loop(steps=3, rollout={"workers": 1, "cpus_per_worker": 0.25})
    try:
        metrics = loop.run()
        assert loop.engines_match()
    finally:
        loop.close()
    # its 3-token prompts too (batch_invariance.py keeps their attention off ATen's small bmm)
    assert all(m["logprob_mismatch_max"] == 0.0 for m in metrics)
    keys = ("reverse_kl", "loss", "grad_norm", "logprob_mismatch_mean", "logprob_mismatch_max")
    for key in (*keys, "completion_len"):
        assert [m[key] for m in metrics] == [m[key] for m in local], key
