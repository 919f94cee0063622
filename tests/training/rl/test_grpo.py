"""The GRPO loop learns, not just runs: on a tiny model, a reward a few steps can move."""

import torch

from kiln.training.rl.config import GRPOConfig
from kiln.training.rl.grpo import GRPO, format_step
from tests.engine.tiny import tiny_model, train_tokenizer

TARGET = "o"


def share_of_target(prompt: str, completion: str, row: dict) -> float:
    """The share of the completion's characters that are TARGET."""
    return completion.count(TARGET) / max(1, len(completion))


def _loop(steps=10, **overrides) -> GRPO:
    """The toy task's loop: a tiny model rewarded for TARGET, 2 prompts x 8 a step."""
    tok = train_tokenizer()
    policy = tiny_model("llama", tok.get_vocab_size(), seed=1)
    with torch.no_grad():  # flatter logits than serving tests want: a group must differ
        policy.output.weight.mul_(0.3)
    fields = {
        "rewards": [{"function": f"{__name__}:share_of_target"}],
        "steps": steps,
        "prompts_per_step": 2,
        "group_size": 8,
        "max_new_tokens": 8,
        "prompt_format": "raw",
        "optimizer": {"lr": 1e-1, "weight_decay": 0.0},
        # the completions' seeds: over seeds 1-5 the margin below measured 0.27-0.59 (0.16-0.45
        # before the sampler drew by inverse CDF); seed 1's is 0.59
        "seed": 1,
    }
    cfg = GRPOConfig(**{**fields, **overrides})
    rows = [{"prompt": p} for p in ("the quick", "hello world", "kiln turns", "ray serve")]
    return GRPO(policy, tok, rows, cfg, eos_token_ids=[0])


def _run(steps=10, on_step=None, **overrides):
    loop = _loop(steps, **overrides)
    return loop, loop.run(on_step=on_step or (lambda m: print(format_step(m))))


def test_reward_rises_with_a_fixed_seed():
    _, metrics = _run()
    rewards = [m["reward"] for m in metrics]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards  # measured: 0.05 -> 0.64
    assert max(m["logprob_mismatch_max"] for m in metrics) < 1e-5
    assert all(m["refit_s"] >= 0 and f"reward/{__name__}:share_of_target" in m for m in metrics)


def test_lora_with_kl_and_two_iterations_per_batch():
    loop, metrics = _run(
        steps=3, lora={"rank": 4, "alpha": 8}, beta=0.04, num_iterations=2, epsilon_high=0.28
    )
    base = {k: v for k, v in loop.policy.state_dict().items() if "lora" not in k}
    engine = loop.rollouts.generator.model.state_dict()
    # KL is reported from each batch's last pass, after the first update moved the adapters
    # away from zero; a reference that were the trained policy itself would give 0
    assert all(m["kl"] > 0.0 for m in metrics)
    assert any(m["clip_fraction"] > 0 for m in metrics)  # the second pass sees ratios != 1
    # the base stays frozen; the engine decodes the merged policy
    assert any(not torch.equal(engine[k], v) for k, v in base.items() if k in engine)
    assert max(m["logprob_mismatch_max"] for m in metrics) < 1e-5


def test_full_finetuning_with_kl_keeps_a_frozen_reference_and_dapo_options_run():
    loop, metrics = _run(
        steps=2,
        beta=0.04,
        importance_sampling_level="sequence",
        loss_aggregation="dr_grpo",
        dynamic_sampling=True,
    )
    assert loop.reference is not None
    assert not any(p.requires_grad for p in loop.reference.parameters())
    assert all(0 < m["kept_fraction"] <= 1 for m in metrics)
    assert metrics[-1]["kl"] > 0


def test_default_logprobs_equal_the_trainers_bit_for_bit():
    """By default (rollout.batch_invariant) the engine's KV-cache decode and the trainer's
    full forward compute each token alike, so on CPU fp32 the sampling log-probs are the
    trainer's exactly and the importance ratio is exactly 1, with no extra forward. With SDPA's
    fused kernel they differ in the last bits; `recompute_logprobs` (the engine scores its
    samples with a full forward) makes those equal too."""
    loop, metrics = _run(steps=3, on_step=lambda m: None)
    assert all(m["logprob_mismatch_max"] == 0.0 for m in metrics)
    update = loop.last_update
    assert torch.equal(update.is_ratio, torch.ones_like(update.is_ratio))
    _, fused = _run(steps=3, on_step=lambda m: None, rollout={"batch_invariant": False})
    assert 0.0 < max(m["logprob_mismatch_max"] for m in fused) < 1e-5
    exact, recomputed = _run(
        steps=3,
        on_step=lambda m: None,
        rollout={"batch_invariant": False, "recompute_logprobs": True},
    )
    assert all(m["logprob_mismatch_max"] == 0.0 for m in recomputed)
    assert torch.equal(exact.last_update.is_ratio, torch.ones_like(exact.last_update.is_ratio))
    # the same completions either way: only the recorded log-probs differ
    assert [m["reward"] for m in recomputed] == [m["reward"] for m in fused]
