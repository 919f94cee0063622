"""Cross entropy, and the loss-parallel context for logits sharded over the vocabulary (TP)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy in fp32; also on vocab-sharded DTensor logits (loss_parallel)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=-100)


def loss_parallel_context(enabled: bool):
    """torch's loss_parallel (forward and backward must both run inside it) or a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def to_local_loss(loss: torch.Tensor) -> torch.Tensor:
    """A plain scalar (loss_parallel returns a replicated DTensor)."""
    return loss.full_tensor() if isinstance(loss, DTensor) else loss
