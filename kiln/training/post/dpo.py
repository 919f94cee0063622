"""The DPO loss and its metrics, from summed log-probs of chosen/rejected replies.

Variants (as TRL's `DPOTrainer._compute_loss` and open-instruct's `dpo_norm` compute them):

- `sigmoid`: -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))  (Rafailov et al. 2023)
- `ipo`: ((pi_c - ref_c) / |c| - (pi_r - ref_r) / |r| - 1 / (2 beta))^2  (Azar et al. 2023, Eq. 17;
  log-ratios averaged over reply tokens, as TRL does)
- `sigmoid_norm`: the sigmoid loss on per-token log-probs (each of the four divided by its
  reply length), so beta acts on a per-token margin.

Metrics: rewards/chosen and rewards/rejected = beta * log-ratio (per token for sigmoid_norm),
rewards/accuracies = share of pairs with chosen reward > rejected, rewards/margins = mean gap.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

DPOLossType = Literal["sigmoid", "ipo", "sigmoid_norm"]


class DPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beta: float = Field(0.1, gt=0, description="Strength of the pull toward the reference.")
    loss_type: DPOLossType = Field("sigmoid", description="sigmoid, ipo or sigmoid_norm.")
    reference: Literal["precomputed", "adapters_disabled"] = Field(
        "precomputed",
        description="Reference log-probs: one pass over the data before training, or (LoRA) "
        "the base with adapters disabled at every step.",
    )


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    chosen_tokens: torch.Tensor,
    rejected_tokens: torch.Tensor,
    beta: float = 0.1,
    loss_type: DPOLossType = "sigmoid",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(mean loss, metrics) for a batch of pairs; every input is [B] (summed log-probs, counts)."""
    chosen_ratio = policy_chosen - reference_chosen
    rejected_ratio = policy_rejected - reference_rejected
    n_chosen = chosen_tokens.clamp(min=1).to(chosen_ratio.dtype)
    n_rejected = rejected_tokens.clamp(min=1).to(rejected_ratio.dtype)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "ipo":
        delta = chosen_ratio / n_chosen - rejected_ratio / n_rejected
        losses = (delta - 1 / (2 * beta)) ** 2
    elif loss_type == "sigmoid_norm":
        chosen_ratio, rejected_ratio = chosen_ratio / n_chosen, rejected_ratio / n_rejected
        losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}")
    chosen_rewards = beta * chosen_ratio.detach()
    rejected_rewards = beta * rejected_ratio.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
    }
    return losses.mean(), metrics


def split_pairs(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A preference batch holds the B chosen rows first, then the B rejected rows."""
    half = values.shape[0] // 2
    return values[:half], values[half:]
