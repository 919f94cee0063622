"""Per-token divergences between a student's and a teacher's next-token distributions, over the
whole vocabulary: what on-policy distillation (`distill`) and logit distillation (`sft` with a
teacher) minimise.

The formulas are TRL's `GKDTrainer.generalized_jsd_loss` (trl/trainer/gkd_trainer.py), with
names for its `beta`: `forward_kl` is KL(teacher || student) (beta 0: mass-covering, classic
logit distillation), `reverse_kl` is KL(student || teacher) (beta 1: mode-seeking, the
on-policy distillation loss), `jsd` the generalised Jensen-Shannon divergence with the mixture
beta x teacher + (1 - beta) x student. Both sets of logits are divided by `temperature` first.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

Divergence = Literal["reverse_kl", "forward_kl", "jsd"]


def token_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: Divergence = "reverse_kl",
    *,
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """[..., V] logits -> [...] divergence per position (fp32; the gradient flows into the
    student's logits only)."""
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    if kind == "forward_kl":
        return kl(teacher, student)
    if kind == "reverse_kl":
        return kl(student, teacher)
    if kind != "jsd":
        raise ValueError(f"unknown divergence {kind!r}")
    if not 0.0 < jsd_beta < 1.0:
        raise ValueError(f"jsd_beta must lie strictly between 0 and 1 (got {jsd_beta})")
    mixture = torch.logsumexp(
        torch.stack([student + math.log(1 - jsd_beta), teacher + math.log(jsd_beta)]), dim=0
    )
    return jsd_beta * kl(teacher, mixture) + (1 - jsd_beta) * kl(student, mixture)


def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_v p (log p - log q) over the last dim, from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)
