"""What an objective hands the one trainer, stated up front (torchtitan's TrainSpec style).

The trainer reads its loss, its model adapter and its accumulation mode from here, never from
which of its methods a subclass overrides, so a reader sees an objective's choices in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kiln.training.parallel.loss import cross_entropy_loss

TokenLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ModelAdapter = Callable[[nn.Module], nn.Module]
# (model, tokens, labels, reference log-probs table or None, pair rows) -> (loss, metrics)
PairLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class TrainSpec:
    """An objective's hooks into `Trainer`.

    loss: the mean token loss of (logits [B, S, V], labels [B, S], -100 ignored); the trainer
        applies it in the train step, the pipeline's last stage and validation.
    adapt_model: applied to the full model after it is built and before it is carved into
        pipeline stages and parallelized (post-training loads its base weights and swaps in
        LoRA there). Its presence builds the model in full: it needs real weights, not meta.
    accumulates_in_schedule: under pipeline parallelism, all grad_accum micro-batches go
        through one schedule step (one gradient reduction per optimizer step); False when the
        objective's own loop steps the schedule once per micro-batch.
    pair_loss: a preference objective's loss over (chosen, rejected) rows, which needs each
        row's reference log-probs and so cannot be a token loss (DPO); set, the post-trainer's
        train and validation steps use it in place of `loss`.
    """

    loss: TokenLoss = cross_entropy_loss
    adapt_model: ModelAdapter | None = None
    accumulates_in_schedule: bool = True
    pair_loss: PairLoss | None = None


def pretraining_spec() -> TrainSpec:
    """Next-token cross entropy on a freshly initialised model."""
    return TrainSpec()
