"""The TrainSpec of SFT and DPO: the base model adapted before parallelize, the objective's own
accumulation loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from kiln.model.formats.weights import load_weights
from kiln.model.lora import LoRAConfig, apply_lora
from kiln.training.parallel.loss import cross_entropy_loss
from kiln.training.post.packed_attention import enable_document_masking
from kiln.training.train_spec import TrainSpec

log = logging.getLogger("kiln.training.post")


class PostTrainingAdapter:
    """Loads the base weights into the freshly built model, swaps in LoRA and, for packed chat
    data, turns on per-document attention masking; `packed` is asked when the model is built
    (the chat dataset is read then, not when the trainer is made)."""

    def __init__(
        self, base_state: dict | None, lora: LoRAConfig | None, packed: Callable[[], bool]
    ) -> None:
        self._base_state = base_state
        self.lora = lora
        self.packed = packed

    def __call__(self, model: nn.Module) -> nn.Module:
        if self._base_state is not None:
            load_weights(model, self._base_state)
            self._base_state = None  # copied into the model: drop the host copy
        if self.lora is not None:
            swapped = apply_lora(model, self.lora)
            log.info("LoRA on %d linear layers (rank %d)", len(swapped), self.lora.rank)
        if self.packed():
            enable_document_masking(model)
        return model


def post_training_spec(adapter: PostTrainingAdapter) -> TrainSpec:
    """SFT's loss is the masked token cross entropy (prompt positions carry -100); DPO's pair
    loss needs the reference log-probs of each row, so PostTrainer's DPO step computes it from
    sequence log-probs and the token loss serves no DPO path. Both step the pipeline schedule
    once per micro-batch from their own accumulation loop."""
    return TrainSpec(loss=cross_entropy_loss, adapt_model=adapter, accumulates_in_schedule=False)
