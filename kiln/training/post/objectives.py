"""SFT and preference objectives on the trainer's batches (labels already shifted, -100 ignored).

`sft_loss` is the trainer's token cross entropy: mean over trained tokens, as `transformers`
computes it for labels holding -100. `sequence_logps` sums the log-probabilities of each row's
trained tokens: what DPO compares between policy and reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.training.post.chat_dataset import IGNORE_INDEX


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the tokens whose label is not -100 (fp32)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=IGNORE_INDEX
    )


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
