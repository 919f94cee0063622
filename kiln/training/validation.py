"""Validation during training: held-out metrics every `eval_interval` steps and after the last.

Each validation reads the same `eval_batches` micro-batches of the eval split from its start (so
successive values are comparable), forward-only, each data-parallel rank its own share, and
averages them over ranks as the training loss is averaged. Under pipeline parallelism the
schedule's forward-only `eval` carries them through the stages. The trainer (or a subclass:
post-training adds DPO's reward accuracy) says what one batch measures (`Trainer.eval_batch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kiln.training.trainer import Trainer


class Validator:
    """Runs the trainer's `eval_batch` over the eval loader's first batches and reduces them."""

    def __init__(self, trainer: Trainer, loader) -> None:
        self.trainer = trainer
        self.loader = loader
        cfg = trainer.cfg
        self.interval, self.total = cfg.eval_interval, cfg.steps
        # under pp one schedule step eats grad_accum micro-batches at once
        self.per_round = trainer.grad_accum if trainer._accumulates_in_schedule() else 1
        self.rounds = max(1, -(-cfg.eval_batches // self.per_round))

    def due(self, step: int) -> bool:
        return bool(self.interval) and (step % self.interval == 0 or step == self.total)

    @torch.no_grad()
    def run(self) -> dict[str, float]:
        self.loader.load_state_dict({"samples_consumed": 0, "seq_len": self.loader.seq_len})
        sums: dict[str, torch.Tensor] = {}
        for _ in range(self.rounds):
            batches = [next(self.loader) for _ in range(self.per_round)]
            batch = tuple(torch.cat(parts) for parts in zip(*batches, strict=True))
            for key, value in self.trainer.eval_batch(batch).items():
                sums[key] = sums.get(key, 0.0) + value.detach().float()
        return self.trainer.reduce_eval({k: v / self.rounds for k, v in sums.items()})
