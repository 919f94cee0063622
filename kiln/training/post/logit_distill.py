"""Logit distillation, an `sft` option: a frozen teacher's logits on the same fixed chat data,
and the student's loss mixes the masked cross entropy with a per-token divergence to them
(Hinton et al. 2015; the divergences are divergence.py's). Only trained positions (those with a
label) count, as for the cross entropy.

loss = (1 - weight) x cross_entropy + weight x temperature^2 x divergence
(the temperature^2 keeps the divergence's gradients at the cross entropy's scale, as Hinton's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from kiln.training.post.chat_dataset import IGNORE_INDEX
from kiln.training.post.divergence import Divergence, token_divergence


class LogitDistillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str = Field(
        ...,
        description="The teacher: any model kiln reads (checkpoint, HF folder, export) with the "
        "student's tokenizer.",
    )
    divergence: Divergence = Field(
        "forward_kl",
        description="forward_kl KL(teacher||student) (classic distillation), reverse_kl, or jsd.",
    )
    jsd_beta: float = Field(0.5, gt=0, lt=1, description="jsd's mixture weight of the teacher.")
    temperature: float = Field(1.0, gt=0, description="Both models' logits divided by this.")
    weight: float = Field(
        0.5, ge=0, le=1, description="Share of the divergence in the loss (the rest: SFT's CE)."
    )


def logit_distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    cfg: LogitDistillConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) over the positions with a label; logits [..., V], labels [...]."""
    trained = labels != IGNORE_INDEX
    student, teacher, targets = student_logits[trained], teacher_logits[trained], labels[trained]
    ce = F.cross_entropy(student.float(), targets)
    divergence = token_divergence(
        student, teacher, cfg.divergence, jsd_beta=cfg.jsd_beta, temperature=cfg.temperature
    ).mean()
    loss = (1 - cfg.weight) * ce + cfg.weight * cfg.temperature**2 * divergence
    return loss, {
        "distill/ce": float(ce.detach()),
        "distill/divergence": float(divergence.detach()),
    }
