"""SFT and DPO as objectives on the one trainer: `PostTrainer` is `Trainer` with a base model,
LoRA swapped in before parallelize (its TrainSpec's adapter, post/train_spec.py), chat batches
and the objective.

Everything else (layouts, optimizer over trainable parameters only, schedules, checkpoints,
resume, metrics) is the trainer's. Reference log-probs for DPO are either precomputed in one
pass over the preference data before the first step (cached beside the checkpoints, no second
model in memory) or, with LoRA, taken from the same model with its adapters disabled.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from kiln.model.formats.mtp_names import without_mtp
from kiln.model.formats.weights import read_weights
from kiln.model.lora import LORA_PARAMS, adapters_disabled
from kiln.platform.errors import ConfigError, InputError
from kiln.text.tokenizer import find_tokenizer
from kiln.training.data.loader import TokenLoader
from kiln.training.parallel.context_parallel import shard_for_context_parallel
from kiln.training.parallel.loss import loss_parallel_context, to_local_loss
from kiln.training.post.adapter_checkpoint import AdapterCheckpointer
from kiln.training.post.chat_dataset import IGNORE_INDEX, ChatDataset, ChatSource
from kiln.training.post.config import PostTrainConfig
from kiln.training.post.dpo import split_pairs
from kiln.training.post.logit_distill import logit_distill_loss
from kiln.training.post.objectives import sequence_logps
from kiln.training.post.packed_attention import document_masking
from kiln.training.post.teacher import load_teacher
from kiln.training.post.train_spec import PostTrainingAdapter, post_training_spec
from kiln.training.precision import autocast_context, fp8_context
from kiln.training.trainer import Trainer

log = logging.getLogger("kiln.training.post")
REFERENCE_FILE = "reference_logps.npy"


def chat_prefix(cfg: PostTrainConfig, split: str | None = None) -> str:
    """The chat dataset's prefix of `split` (default: data.split)."""
    if len(cfg.data.paths) != 1:
        raise ConfigError(f"{cfg.objective}: data.paths must name one prepared chat dataset")
    path = cfg.data.paths[0]
    if os.path.isdir(path):
        return os.path.join(path, split or cfg.data.split)
    if split and split != cfg.data.split:
        raise ConfigError(f"eval_split {split!r}: data.paths names one prefix, not a folder")
    return path


class PostTrainer(Trainer):
    cfg: PostTrainConfig
    trained_tokens_only = True  # SFT's output layer on labelled positions only (one process)

    def __init__(self, cfg: PostTrainConfig, on_step=None, dataloader=None) -> None:
        base_state = None
        if cfg.base:
            _, base_cfg, base_state = read_weights(cfg.base)
            # post-training trains the main model: multi-token prediction is pretraining's
            base_cfg, base_state = without_mtp(base_cfg, base_state)
            if base_cfg.max_seq_len < cfg.seq_len:
                base_cfg = base_cfg.model_copy(update={"max_seq_len": cfg.seq_len})
            cfg = cfg.model_copy(update={"model": base_cfg})
        adapter = PostTrainingAdapter(base_state, cfg.lora, self._packed)
        spec = post_training_spec(adapter, cfg.dpo if cfg.objective == "dpo" else None)
        super().__init__(cfg, on_step=on_step, dataloader=dataloader, spec=spec)
        self._post_metrics: dict[str, float] = {}
        # DPO's precomputed reference log-probs (train and held-out rows), filled in setup()
        self._reference: torch.Tensor | None = None
        self._eval_reference: torch.Tensor | None = None
        self.teacher: nn.Module | None = None  # logit distillation's (sft with distill:)

    # -- setup ----------------------------------------------------------------------------

    def _build_model(self) -> None:
        super()._build_model()
        if self.cfg.lora is not None:
            # parallelize re-registers parameters (torch's SequenceParallel makes norm weights
            # fresh nn.Parameters that require grad): freeze the base again before the
            # optimizer sees the parameters
            for part in self.model_parts:
                for name, p in part.named_parameters():
                    p.requires_grad_(name.rsplit(".", 1)[-1] in LORA_PARAMS)

    def build_checkpointer(self, ckpt_cfg=None):
        """LoRA on a base: adapter-only checkpoints (the base is referenced, not copied)."""
        if self.cfg.lora is None or not self.cfg.base:
            return super().build_checkpointer(ckpt_cfg)

        return AdapterCheckpointer(
            **self.checkpointer_args(ckpt_cfg),
            base=self.cfg.base,
            lora=self.cfg.lora.model_dump(mode="json"),
        )

    def _packed(self) -> bool:
        return self.cfg.objective == "sft" and bool(self._chat_meta().get("packed"))

    def _chat_meta(self) -> dict:
        if not hasattr(self, "_meta"):
            self._meta = ChatDataset(chat_prefix(self.cfg)).meta
        return self._meta

    def _build_dataloader(self):
        cfg = self.cfg
        source = ChatSource(chat_prefix(cfg), seed=cfg.data.seed or cfg.seed)
        want = "preference" if cfg.objective == "dpo" else "sft"
        if source.dataset.kind != want:
            raise ConfigError(
                f"{cfg.objective}: data.paths holds {source.dataset.kind} data, expected {want} "
                f"(prepare it with prepare-{'preference' if want == 'preference' else 'chat'})"
            )
        if source.seq_len != cfg.seq_len:
            raise ConfigError(
                f"seq_len {cfg.seq_len} differs from the chat dataset's {source.seq_len}"
            )
        if self._packed() and (self.dims.pp_enabled or self.dims.cp_enabled):
            raise ConfigError("packed chat data with pp or cp > 1: prepare it with packing off")
        return TokenLoader(
            source,
            seq_len=cfg.seq_len,
            micro_batch_size=cfg.micro_batch_size,
            dp_rank=self.dims.dp_rank,
            dp_size=self.dims.dp_size,
            prefetch=cfg.data.prefetch,
            description={"source": "chat", "path": chat_prefix(cfg), "seed": source.seed},
        )

    def _build_eval_loader(self):
        """The held-out split of the chat dataset, in order."""

        cfg = self.cfg
        source = ChatSource(chat_prefix(cfg, cfg.eval_split), seed=cfg.seed, shuffle=False)
        return TokenLoader(
            source,
            seq_len=cfg.seq_len,
            micro_batch_size=cfg.micro_batch_size,
            dp_rank=self.dims.dp_rank,
            dp_size=self.dims.dp_size,
            prefetch=0,
        )

    def setup(self) -> PostTrainer:
        super().setup()
        if self.cfg.distill is not None:
            self.teacher = self._load_teacher()
        if self.cfg.objective == "dpo" and self.cfg.dpo.reference == "precomputed":
            self._reference = torch.from_numpy(self._reference_table()).to(self.device)
            if self.validator is not None:
                held_out = self.validator.loader.source.dataset
                table = self._reference_table(held_out, f"{self.cfg.eval_split}.{REFERENCE_FILE}")
                self._eval_reference = torch.from_numpy(table).to(self.device)
        return self

    def _load_teacher(self) -> nn.Module:
        """The frozen teacher on this rank's device, checked against the chat data's tokenizer."""
        try:
            student_tok, _ = find_tokenizer(None, [os.path.dirname(chat_prefix(self.cfg))])
        except InputError:
            student_tok = None
        teacher = load_teacher(
            "distill.teacher",
            self.cfg.distill.teacher,
            self.cfg.model.vocab_size,
            student_tok,
            device=self.device,
        )
        log.info("logit distillation from %s (%s)", self.cfg.distill.teacher, self.cfg.distill)
        return teacher

    # -- DPO reference ----------------------------------------------------------------------

    @torch.no_grad()
    def _reference_table(self, dataset=None, name: str = REFERENCE_FILE) -> np.ndarray:
        """[pairs, 2] summed log-probs (chosen, rejected) of the reference: one pass over the
        data (default: the training data) on every rank in the same order (collectives stay
        matched), cached on disk."""
        cache = os.path.join(self.cfg.checkpoint.dir, name) if self.cfg.checkpoint.dir else None
        if cache and os.path.isfile(cache):
            return np.load(cache)
        if self.step > 0 and self.cfg.lora is None:
            raise InputError(f"resuming full-weight DPO needs the reference cache {cache}")
        dataset = dataset if dataset is not None else self.dataloader.source.dataset
        mb = self.cfg.micro_batch_size
        table = np.zeros((len(dataset), 2), dtype=np.float64)
        model = self.model_parts[0]
        for first in range(0, len(dataset), mb):
            rows = np.arange(first, first + mb) % len(dataset)  # the last batch wraps: same shapes
            tokens, labels, _, _ = (
                torch.from_numpy(a).to(self.device) for a in dataset.gather_rows(rows)
            )
            with self._contexts(), adapters_disabled(model):
                logps, _ = sequence_logps(model(tokens), labels)
            chosen, rejected = split_pairs(logps.double().cpu())
            table[rows, 0], table[rows, 1] = chosen.numpy(), rejected.numpy()
        if cache and self.rank == 0:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            np.save(cache + ".tmp.npy", table)
            os.replace(cache + ".tmp.npy", cache)
        log.info("reference log-probs of %d pairs precomputed", len(dataset))
        return table

    # -- one optimizer step -----------------------------------------------------------------

    def _contexts(self):
        cfg = self.cfg
        stack = contextlib.ExitStack()
        stack.enter_context(autocast_context(cfg.precision, self.device.type, self.distributed))
        stack.enter_context(fp8_context(cfg))
        stack.enter_context(loss_parallel_context(self.loss_parallel))
        return stack

    def _accumulate_gradients(self) -> torch.Tensor:
        loss_sum = torch.zeros((), device=self.device)
        self._post_metrics = {}
        for micro in range(self.grad_accum):
            batch = [t.to(self.device, non_blocking=True) for t in next(self._batches)]
            self._set_grad_sync(micro == self.grad_accum - 1)
            if self.spec.pair_loss is not None:
                loss_sum += self._pair_step(*batch).float()
            else:
                loss_sum += self._sft_step(*batch).float()
        return loss_sum / self.grad_accum

    def _head_on_trained_tokens(self) -> bool:
        """One process, a plain model: the output layer (the largest matmul) runs only on the
        positions that carry a label; distributed layouts keep the trainer's full-logits path
        (FSDP/TP own the head's parameters inside the model's forward)."""
        model = self.model_parts[0]
        return (
            self.trained_tokens_only
            and not self.distributed
            and not self.cfg.model.n_experts
            and isinstance(getattr(model, "output", None), nn.Linear)
        )

    def _trained_token_loss(self, model, tokens, labels, positions) -> torch.Tensor:
        """Mean cross entropy over labelled positions, the head applied to those rows only: the
        same value and gradients as the full logits with -100 ignored."""
        head, trained = model.output, labels != IGNORE_INDEX
        model.output = None  # the model then returns the final norm's hidden states
        try:
            hidden = model(tokens, positions=positions)
        finally:
            model.output = head
        return self.spec.loss(head(hidden[trained])[None], labels[trained][None])

    def _sft_step(self, tokens, labels, positions, document_ids) -> torch.Tensor:
        if self.teacher is not None:
            return self._distill_step(tokens, labels, positions, document_ids)
        if self._head_on_trained_tokens():
            model = self.model_parts[0]
            packed = self._packed()
            masking = document_masking(model, document_ids) if packed else contextlib.nullcontext()
            with self._contexts(), masking:
                loss = self._trained_token_loss(
                    model, tokens, labels, positions if packed else None
                )
                (loss * (self.scaler.scale / self.grad_accum)).backward()
            return loss.detach()
        if not self._packed():  # plain rows: exactly pretraining's masked cross entropy
            if self.dims.cp_enabled:
                tokens, labels = shard_for_context_parallel(tokens, labels, self.dims.mesh("cp"))
            return self._forward_backward(tokens, labels)
        model = self.model_parts[0]
        # backward inside the mask's block: recompute (activation checkpointing) needs it too
        with self._contexts(), document_masking(model, document_ids):
            loss = self.spec.loss(model(tokens, positions=positions), labels)
            (loss * (self.scaler.scale / self.grad_accum)).backward()
        return to_local_loss(loss).detach()

    def _distill_step(self, tokens, labels, positions, document_ids) -> torch.Tensor:
        """SFT's cross entropy mixed with the divergence to the teacher's logits on the same
        tokens (packed rows: both models masked per document)."""
        model, packed = self.model_parts[0], self._packed()
        positions = positions if packed else None

        def masking(m):
            return document_masking(m, document_ids) if packed else contextlib.nullcontext()

        with self._contexts():
            with torch.no_grad(), masking(self.teacher):
                teacher_logits = self.teacher(tokens, positions=positions)
            with masking(model):
                student_logits = model(tokens, positions=positions)
                loss, metrics = logit_distill_loss(
                    student_logits, teacher_logits, labels, self.cfg.distill
                )
                (loss * (self.scaler.scale / self.grad_accum)).backward()
        for k, v in metrics.items():
            self._post_metrics[k] = self._post_metrics.get(k, 0.0) + v / self.grad_accum
        return loss.detach()

    def _pair_step(self, tokens, labels, positions, document_ids, rows) -> torch.Tensor:
        model = self.model_parts[0]
        with self._contexts():
            loss, metrics = self.spec.pair_loss(model, tokens, labels, self._reference, rows)
            (loss * (self.scaler.scale / self.grad_accum)).backward()
        for k, v in metrics.items():
            self._post_metrics[k] = self._post_metrics.get(k, 0.0) + float(v) / self.grad_accum
        return loss.detach()

    # -- validation ---------------------------------------------------------------------------

    def eval_batch(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """SFT: the held-out masked loss; DPO: the held-out DPO loss and reward accuracy."""
        tokens, labels, positions, document_ids, *rows = (t.to(self.device) for t in batch)
        model = self.model_parts[0]
        if self.spec.pair_loss is not None:
            return self._pair_eval(model, tokens, labels, rows[0])
        if not self._packed():  # plain rows: pretraining's held-out loss (pp, cp included)
            return super().eval_batch((tokens, labels))
        with self._contexts(), document_masking(model, document_ids):
            loss = self.spec.loss(model(tokens, positions=positions), labels)
        return {"val_loss": to_local_loss(loss)}

    def _pair_eval(self, model, tokens, labels, rows) -> dict[str, torch.Tensor]:
        with self._contexts():
            loss, metrics = self.spec.pair_loss(model, tokens, labels, self._eval_reference, rows)
        return {
            "val_loss": loss,
            "val_rewards/accuracies": metrics["rewards/accuracies"],
            "val_rewards/margins": metrics["rewards/margins"],
        }

    def train_step(self) -> dict[str, Any]:
        metrics = super().train_step()
        post = dict(self._post_metrics)
        if post and self.distributed:  # average over ranks (replicas within a DP group agree)
            values = torch.tensor(list(post.values()), dtype=torch.float64, device=self.device)
            dist.all_reduce(values)
            post = dict(zip(post, (values / dist.get_world_size()).tolist(), strict=True))
        return {**metrics, **post}
