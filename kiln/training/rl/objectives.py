"""GRPO-family objectives on per-token log-probabilities (pure torch, any layout).

Shapes: B completions (prompts x group_size, a group's completions adjacent), T completion
positions; `mask` [B, T] is 1 on real completion tokens. The formulas follow TRL 1.16's
`GRPOTrainer` (trl/trainer/grpo_trainer.py: advantages at lines 2761-2788, `_compute_loss` at
3020-3180) so a recipe moves between the two unchanged; tests/training/rl/test_objectives.py
checks them against that code's formulas. Kiln's aggregation names say what is averaged:

- `token`: every completion token of the batch weighs the same (TRL's `bnpo`; DAPO's loss on
  one process),
- `sequence`: each completion's token mean, then the mean over completions (TRL's `grpo`),
- `dr_grpo`: the token sum over B x max_completion_length (Dr. GRPO: no length bias).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token", "sequence", "dr_grpo"]
ImportanceLevel = Literal["token", "sequence"]
RewardScaling = Literal["group", "batch", "none"]

STD_EPS = 1e-4  # TRL's: a group whose rewards are all equal gets advantage 0, not NaN


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_rewards: RewardScaling = "group"
) -> torch.Tensor:
    """Reward minus its group's mean, divided by the group's (or the batch's) std; [B] -> [B]."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    if scale_rewards == "batch":
        std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else rewards * 0
    else:
        std = grouped.std(dim=1).repeat_interleave(group_size) if group_size > 1 else rewards * 0
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPS)
    return advantages


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling: [B] bool, False for every completion of a group whose rewards are
    all equal (zero advantage, so no gradient; keeping them only dilutes the batch)."""
    grouped = rewards.view(-1, group_size)
    varied = (grouped != grouped[:, :1]).any(dim=1)
    return varied.repeat_interleave(group_size)


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering: completions cut at the length limit contribute no tokens."""
    return mask * (~truncated).to(mask.dtype)[:, None]


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate k3 = exp(r) - r - 1, r = ref - policy (>= 0)."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


def behaviour_ratio(
    old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """pi_trainer / pi_behaviour per token, exp(old_logp - sampling_logp) (1 on padding): the
    trainer's current policy over the one the engine sampled with, which differs by the
    engine's arithmetic on-policy, and by up to `max_policy_lag` updates when sampled ahead."""
    return torch.exp((old_logp - sampling_logp) * mask).detach()


def tis_weights(
    old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance sampling: min(pi_trainer / pi_engine, cap) per token, correcting for
    the sampler's log-probs differing from the trainer's (TRL's `token_truncate`; Yao et al.
    2025's TIS, also the off-policy correction of rollouts sampled ahead)."""
    return torch.clamp(behaviour_ratio(old_logp, sampling_logp, mask), max=cap)


@dataclass
class LossStats:
    kl: float  # mean k3 KL over real tokens (0 when beta is 0)
    clip_fraction: float  # share of real tokens whose ratio the clip bound held back
    ratio_mean: float


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation, max_completion_length: int
) -> torch.Tensor:
    if how == "token":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if how == "sequence":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    aggregation: Aggregation = "token",
    importance_level: ImportanceLevel = "token",
    max_completion_length: int | None = None,
    tis: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped-ratio policy loss (GRPO; GSPO with importance_level="sequence"; DAPO's
    clip-higher with epsilon_high > epsilon_low) plus beta x k3 KL to the reference.
    `logp` carries the gradient; `old_logp` are the log-probs the batch was sampled under (the
    trainer's, before this step's updates); `tis` optional per-token weights (`tis_weights`)."""
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    if importance_level == "sequence":
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_ratio = seq[:, None]
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, clipped * adv)
    if tis is not None:
        per_token = per_token * tis
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta != 0 needs the reference log-probs")
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + beta * kl
    length = max_completion_length or mask.shape[1]
    loss = aggregate(per_token, mask, aggregation, length)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        held = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
        held = held.to(mask.dtype).expand_as(mask)
        stats = LossStats(
            kl=float((kl * mask).sum() / n) if kl is not None else 0.0,
            clip_fraction=float((held * mask).sum() / n),
            ratio_mean=float((ratio.expand_as(mask) * mask).sum() / n),
        )
    return loss, stats
