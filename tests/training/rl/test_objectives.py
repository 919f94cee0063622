"""Kiln's GRPO-family losses against TRL's. TRL 1.x does not install beside this project's pins
(it needs datasets >= 5.1 with pyarrow 23+, which needs numpy 2; with pyarrow < 23 it
downgrades transformers), so `trl_loss` below transcribes TRL 1.16.0's
trl/trainer/grpo_trainer.py `GRPOTrainer._compute_loss` (lines 3066-3170: the ratio, the clip,
the k3 KL, the loss types) and `trl_advantages` its advantages (lines 2761-2788), statement by
statement, with TRL's own variable names. test_trl_peer.py checks the same losses against
the real GRPOTrainer, installed in a venv of its own."""

import pytest
import torch

from kiln.training.rl.objectives import (
    group_advantages,
    grpo_loss,
    informative_groups,
    overlong_filter,
    tis_weights,
)

B, T, MAX_LEN = 6, 7, 9
TRL_LOSS_TYPE = {"token": "bnpo", "sequence": "grpo", "dr_grpo": "dr_grpo"}


def trl_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, mask, *,
             beta, epsilon_low, epsilon_high, loss_type, importance_sampling_level,
             max_completion_length, importance_sampling_ratio=None):  # fmt: skip
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps)
            - (ref_per_token_logps - per_token_logps)
            - 1
        )
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)


def trl_advantages(rewards, num_generations, scale_rewards):
    mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = rewards.view(-1, num_generations).std(dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:
        std_rewards = rewards.std().expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # ratios spread well past 1 +- 0.28 so both clip bounds are exercised
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4).requires_grad_()
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 4:] = 0
    mask[4, 2:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0], dtype=torch.float64)
    return logp, old, ref, mask, group_advantages(rewards, 3)


@pytest.mark.parametrize("aggregation", ["token", "sequence", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("epsilon_high", [0.2, 0.28])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_and_gradient_equal_trl(aggregation, beta, epsilon_high, level):
    logp, old, ref, mask, adv = _batch()
    ours, _ = grpo_loss(
        logp, old, adv, mask, ref_logp=ref, beta=beta, epsilon_low=0.2,
        epsilon_high=epsilon_high, aggregation=aggregation, importance_level=level,
        max_completion_length=MAX_LEN,
    )  # fmt: skip
    (ours_grad,) = torch.autograd.grad(ours, logp)
    theirs = trl_loss(
        logp, old, ref, adv, mask, beta=beta, epsilon_low=0.2, epsilon_high=epsilon_high,
        loss_type=TRL_LOSS_TYPE[aggregation], importance_sampling_level=level,
        max_completion_length=MAX_LEN,
    )  # fmt: skip
    (theirs_grad,) = torch.autograd.grad(theirs, logp)
    assert ours.item() != 0.0
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=0, atol=1e-12)
    assert ours_grad[mask == 0].abs().max() == 0  # padding never gets a gradient


def test_tis_weights_equal_trl_token_truncate():
    logp, old, _, mask, adv = _batch(1)
    sampling = old + 0.5 * torch.randn(
        B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(2)
    )
    tis = tis_weights(old, sampling, mask, cap=2.0)
    assert tis.max() == 2.0 and tis.min() < 1.0
    ours, _ = grpo_loss(logp, old, adv, mask, tis=tis, aggregation="sequence")
    theirs = trl_loss(
        logp, old, None, adv, mask, beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
        loss_type="grpo", importance_sampling_level="token", max_completion_length=T,
        importance_sampling_ratio=torch.clamp(torch.exp((old - sampling) * mask), max=2.0),
    )  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trl(scale):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0])
    ours = group_advantages(rewards, 3, scale)
    torch.testing.assert_close(ours, trl_advantages(rewards, 3, scale))
    assert ours[3:6].abs().max() == 0  # an all-equal group has no advantage


def test_clip_stats_count_the_held_tokens():
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.0]]))
    _, stats = grpo_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    assert stats.clip_fraction == 0.5  # 1.5 with A>0 and 0.5 with A<0; the ratios of 1 are free


def test_dynamic_sampling_and_overlong_filtering():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    assert informative_groups(rewards, 3).tolist() == [False] * 3 + [True] * 3
    mask = overlong_filter(torch.ones(2, 3), torch.tensor([True, False]))
    assert mask.tolist() == [[0, 0, 0], [1, 1, 1]]
