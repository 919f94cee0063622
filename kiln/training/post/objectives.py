"""Per-token and per-sequence log-probs on the trainer's batches (labels already shifted, -100
ignored). SFT's loss is the trainer's token cross entropy (parallel/loss.py); `sequence_logps`
sums the log-probabilities of each row's trained tokens: what DPO compares between policy and
reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.training.post.chat_dataset import IGNORE_INDEX


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) at every position [B, S] (0 where the label is -100). Written as a
    per-token cross entropy so it also runs on vocab-sharded logits under loss_parallel."""
    nll = F.cross_entropy(
        logits.flatten(0, 1).float(),
        labels.flatten(0, 1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    if hasattr(nll, "full_tensor"):  # a DTensor under loss_parallel
        nll = nll.full_tensor()
    return -nll.view(labels.shape)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of trained-token log-probs [B], number of trained tokens [B])."""
    return token_logps(logits, labels).sum(-1), (labels != IGNORE_INDEX).sum(-1)
