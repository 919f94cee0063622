"""The TrainSpec of SFT and DPO: the base model adapted before parallelize, the objective's loss
(SFT's masked token loss, DPO's pair loss), the objective's own accumulation loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from kiln.model.formats.weights import load_weights
from kiln.model.lora import LoRAConfig, adapters_disabled, apply_lora
from kiln.training.parallel.loss import cross_entropy_loss
from kiln.training.post.dpo import DPOConfig, dpo_loss, split_pairs
from kiln.training.post.objectives import sequence_logps
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


class DPOPairLoss:
    """DPO's loss and reward metrics of a batch of pairs. The reference log-probs are the
    precomputed table's `rows`, or (with `reference: model`) the same model's with its LoRA
    adapters disabled and no gradient: no second model in memory."""

    def __init__(self, cfg: DPOConfig) -> None:
        self.cfg = cfg

    def __call__(self, model, tokens, labels, reference, rows):
        policy, n_tokens = sequence_logps(model(tokens), labels)
        if self.cfg.reference == "precomputed":
            ref = reference[rows].to(policy.dtype)
            ref_chosen, ref_rejected = ref[:, 0], ref[:, 1]
        else:
            with torch.no_grad(), adapters_disabled(model):
                ref_chosen, ref_rejected = split_pairs(sequence_logps(model(tokens), labels)[0])
        return dpo_loss(
            *split_pairs(policy),
            ref_chosen,
            ref_rejected,
            *split_pairs(n_tokens),
            beta=self.cfg.beta,
            loss_type=self.cfg.loss_type,
        )


def post_training_spec(adapter: PostTrainingAdapter, dpo: DPOConfig | None) -> TrainSpec:
    """SFT's loss is the masked token cross entropy (prompt positions carry -100); DPO's is the
    pair loss (`dpo` given). Both step the pipeline schedule once per micro-batch from their
    own accumulation loop."""
    return TrainSpec(
        loss=cross_entropy_loss,
        adapt_model=adapter,
        accumulates_in_schedule=False,
        pair_loss=DPOPairLoss(dpo) if dpo is not None else None,
    )
