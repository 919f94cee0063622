"""The training loop: build everything from a TrainConfig, then step.

`Trainer(cfg, spec=...).setup()` builds the mesh, the model (split into pipeline stages if pp > 1),
parallelizes it, and creates optimizers, schedulers and the data loader; `train()` runs
`cfg.steps` optimizer steps and returns the per-step metrics. The objective's loss, model
adapter and accumulation mode come in a `TrainSpec` (train_spec.py; default: pretraining).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from kiln.model import Transformer
from kiln.model.meta import build_on_meta
from kiln.model.moe import moe_aux_loss
from kiln.platform.errors import ConfigError, KilnError
from kiln.training.checkpoint import Checkpointer
from kiln.training.config import TrainConfig
from kiln.training.data import build_dataloader
from kiln.training.data.loader import TokenLoader
from kiln.training.float8 import check_fp8, convert_to_float8, precompute_float8_scales
from kiln.training.launch import (
    enable_tf32,
    local_cuda_index,
    resolve_auto_compile,
    resolve_auto_precision,
)
from kiln.training.metrics import device_peak_flops, flops_per_token, peak_memory_gb
from kiln.training.metrics_log import ProgressClock, progress_line
from kiln.training.optimizer import (
    build_lr_scheduler,
    build_optimizer,
    clip_grads_,
    global_grad_norm,
)
from kiln.training.parallel.context_parallel import shard_for_context_parallel
from kiln.training.parallel.dims import ParallelDims
from kiln.training.parallel.expert_parallel import split_for_grad_norm
from kiln.training.parallel.loss import loss_parallel_context, to_local_loss
from kiln.training.parallel.meta_init import materialize
from kiln.training.parallel.parallelize import parallelize, use_loss_parallel
from kiln.training.parallel.pipeline_parallel import build_pipeline, pipeline_microbatches
from kiln.training.precision import (
    LossScaler,
    autocast_context,
    fp8_context,
    swap_to_te_linear,
)
from kiln.training.router_balance import update_router_biases
from kiln.training.train_spec import TrainSpec, pretraining_spec
from kiln.training.train_state import TrainState
from kiln.training.validation import Validator

if TYPE_CHECKING:
    from kiln.training.checkpoint import CheckpointConfig, Checkpointer

log = logging.getLogger("kiln.training")


class Trainer:
    """Owns the model parts, optimizers, schedulers and loader of one rank."""

    fp8_all_gather = False  # set by _build_model: FSDP2 gathers fp8 weights (scales after steps)

    def __init__(
        self,
        cfg: TrainConfig,
        on_step: Callable[[dict], None] | None = None,
        dataloader=None,
        spec: TrainSpec | None = None,
    ):
        cuda = torch.cuda.is_available()
        self.cfg = resolve_auto_compile(resolve_auto_precision(cfg, cuda), cuda)
        self.on_step = on_step
        self.spec = spec or pretraining_spec()
        self.dataloader = dataloader  # default: build_dataloader(cfg.data, ...) in setup()
        self.train_state = TrainState()
        self.checkpointer: Checkpointer | None = None
        self.model_parts: list[nn.Module] = []
        self.history: list[dict[str, Any]] = []
        self._mtp_losses: list[torch.Tensor] = []  # this step's multi-token prediction losses
        self._clock = ProgressClock(cfg.steps)

    @property
    def step(self) -> int:
        return self.train_state.step

    @property
    def tokens_seen(self) -> int:
        return self.train_state.tokens_seen

    # -- setup ------------------------------------------------------------------------------

    def setup(self) -> Trainer:
        cfg = self.cfg
        self._resolve_layout()
        self.grad_accum = cfg.grad_accum_steps(self.dims.dp_size)
        self._build_model()
        self.optimizers = [build_optimizer(part, cfg.optimizer) for part in self.model_parts]
        self.lr_schedulers = [
            build_lr_scheduler(o, cfg.steps, cfg.schedule) for o in self.optimizers
        ]
        self.scaler = LossScaler(enabled=cfg.precision == "fp16")
        if self.dataloader is None:
            self.dataloader = self._build_dataloader()
        if isinstance(self.dataloader, TokenLoader):  # page-locked only where a GPU copies them
            self.dataloader.pin_memory = self.device.type == "cuda"
        self.flops_per_token = flops_per_token(cfg.model, cfg.seq_len)
        self.peak_flops = device_peak_flops(cfg.precision, cfg.peak_tflops)
        if cfg.checkpoint.dir or cfg.checkpoint.load_from or cfg.checkpoint.init_from:
            self.checkpointer = self.build_checkpointer()
            self.checkpointer.load()
        self._batches = iter(self.dataloader)
        self.validator = self._build_validator() if cfg.eval_interval else None
        return self

    def _build_validator(self):
        try:
            loader = self._build_eval_loader()
        except KilnError as e:
            raise ConfigError(
                f"eval_interval: no validation data in split {self.cfg.eval_split!r} ({e}); "
                "tokenize with valid_fraction > 0, or set eval_interval: 0"
            ) from None
        return Validator(self, loader)

    def _build_eval_loader(self):
        """The eval split, read without prefetch; synthetic data: samples of another seed."""
        cfg = self.cfg
        update: dict[str, Any] = {"split": cfg.eval_split, "prefetch": 0}
        if cfg.data.synthetic:
            update["seed"] = (cfg.seed if cfg.data.seed is None else cfg.data.seed) + 1
        return self._loader_of(cfg.data.model_copy(update=update))

    def _resolve_layout(self) -> None:
        """The layout (validated once), this rank's device and, when distributed, the mesh."""
        cfg = self.cfg
        self.distributed = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.dims = ParallelDims.from_config(cfg.parallel, world)
        self.device = self._pick_device()
        if cfg.precision == "fp8":
            check_fp8(cfg, self.device)
        if cfg.model.n_experts and self.dims.pp_enabled:
            log.warning("MoE load-balancing loss is not added under pipeline parallelism")
        if self.distributed:
            self.dims.build_mesh(self.device.type)

    def _pick_device(self) -> torch.device:
        want = self.cfg.device
        if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
            if not torch.cuda.is_available():
                raise ConfigError("device=cuda but no CUDA device is visible")

            index = local_cuda_index(
                int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                torch.cuda.device_count(),
            )
            torch.cuda.set_device(index)
            enable_tf32()
            return torch.device("cuda", index)
        return torch.device("cpu")

    def _build_model(self) -> None:
        """Build on the meta device, carve this rank's pipeline stage(s), parallelize, then
        allocate and initialise only the local shards (torchtitan's order; the same weights as
        one process, see parallel/meta_init.py). Otherwise every rank builds the full model."""

        cfg, dims = self.cfg, self.dims
        on_meta = self._builds_on_meta()
        model = build_on_meta(cfg.model) if on_meta else self._build_full_model()
        self.fp8_all_gather = cfg.precision == "fp8" and cfg.fp8_all_gather and dims.fsdp_enabled
        if cfg.precision == "fp8" and cfg.fp8_backend == "torchao":
            # before TP and FSDP shard the weights (torchtitan's order); meta or real alike
            convert_to_float8(
                model, cfg.fp8_scaling, tp=dims.tp, fsdp_all_gather=self.fp8_all_gather
            )
        self.loss_parallel = self.distributed and use_loss_parallel(dims, cfg)
        if dims.pp_enabled:
            self.schedule, self.model_parts, self.has_first, self.has_last = build_pipeline(
                model,
                dims.mesh("pp"),
                cfg,
                self.device,
                self._pp_loss,
                parallelize_fn=lambda part: parallelize(part, dims, cfg),
                accumulation=self.grad_accum if self._accumulates_in_schedule() else 1,
            )
        else:
            self.model_parts = [parallelize(model, dims, cfg)]
            self.has_first = self.has_last = True
        if on_meta:  # FSDP's CPU offload keeps the sharded parameters on the CPU
            offload = cfg.optimizer_offload and self.distributed
            init_device = torch.device("cpu") if offload else self.device
            self._materialize(materialize, init_device)

    def _materialize(self, materialize: Callable, init_device: torch.device) -> None:
        """Allocate and initialise the meta-built local shards (`kiln plan` does it on fake
        tensors)."""
        materialize(self.model_parts, self.cfg.model, init_device, self.cfg.seed, self.device)

    def _accumulates_in_schedule(self) -> bool:
        """Whether all grad_accum micro-batches go through one pipeline schedule step."""
        return self.dims.pp_enabled and self.spec.accumulates_in_schedule

    def _builds_on_meta(self) -> bool:
        """`meta_init`, unless Transformer Engine's fp8 (te.Linear copies the weights it
        replaces) or the spec's `adapt_model` needs the full model."""
        cfg = self.cfg
        te_fp8 = cfg.precision == "fp8" and cfg.fp8_backend == "te"
        return cfg.meta_init and not te_fp8 and self.spec.adapt_model is None

    def _build_full_model(self) -> nn.Module:
        """Same seed on every rank: each builds the full model, then keeps and shards its part."""
        torch.manual_seed(self.cfg.seed)
        with torch.device(self.device):  # no CPU detour for big models on a GPU
            model: nn.Module = Transformer(self.cfg.model)
            if self.spec.adapt_model is not None:
                model = self.spec.adapt_model(model)
        if self.cfg.precision == "fp8" and self.cfg.fp8_backend == "te":
            swap_to_te_linear(model)
        return model.to(self.device)

    def _build_dataloader(self):
        return self._loader_of(self.cfg.data)

    def _loader_of(self, data):
        """The loader of `data` (a DataConfig) over this rank's DP share."""

        cfg = self.cfg
        return build_dataloader(
            data,
            seq_len=cfg.seq_len,
            micro_batch_size=cfg.micro_batch_size,
            dp_rank=self.dims.dp_rank,
            dp_size=self.dims.dp_size,
            seed=cfg.seed,
            vocab_size=cfg.model.vocab_size,
        )

    def build_checkpointer(self, ckpt_cfg: CheckpointConfig | None = None) -> Checkpointer:
        """A Checkpointer over this trainer's components (default settings: cfg.checkpoint)."""

        return Checkpointer(**self.checkpointer_args(ckpt_cfg))

    def checkpointer_args(self, ckpt_cfg: CheckpointConfig | None = None) -> dict:
        """What every Checkpointer of this trainer is built from (subclasses add their own)."""
        cfg = self.cfg
        return dict(
            cfg=ckpt_cfg or cfg.checkpoint,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            dataloader=self.dataloader,
            train_state=self.train_state,
            dims=self.dims,
            total_steps=cfg.steps,
            model_config=cfg.model.checkpoint_dump(),
            train_config=cfg.model_dump(mode="json", by_alias=True),
        )

    # -- one optimizer step -----------------------------------------------------------------

    def _pp_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.spec.loss(logits, labels) * self._pp_loss_scale()

    def _pp_loss_scale(self) -> float:
        return self.scaler.scale / (self.grad_accum * pipeline_microbatches(self.cfg))

    def _forward_backward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One micro-batch; returns its (unscaled) mean token loss, or 0 off the last pp stage."""
        cfg = self.cfg
        with (
            autocast_context(cfg.precision, self.device.type, self.distributed),
            fp8_context(cfg),
            loss_parallel_context(self.loss_parallel),
        ):
            if self.dims.pp_enabled:
                return self._pipeline_forward_backward(tokens, labels)
            model = self.model_parts[0]
            mtp = cfg.model.mtp_depth > 0
            loss = self._token_loss(model, tokens, labels, mtp_labels=labels if mtp else None)
            total = loss
            if cfg.model.n_experts:
                # a plain tensor: under loss_parallel `loss` is a DTensor, the aux loss is not
                total = to_local_loss(loss) + cfg.model.moe_aux_loss_coef * moe_aux_loss(model)
            if mtp:  # the logged loss stays the main model's; MTP's is logged as mtp_loss
                total = total + cfg.model.mtp_loss_weight * model.mtp_loss
                self._mtp_losses.append(model.mtp_loss.detach().float())
            (total * (self.scaler.scale / self.grad_accum)).backward()
            return to_local_loss(loss).detach()

    def _token_loss(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        mtp_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The objective's mean token loss; with `loss_chunk_tokens` the model computes the
        cross entropy itself, chunk by chunk, and the full logits never exist. `mtp_labels`:
        the model also sets `mtp_loss`, its multi-token prediction modules' mean loss."""
        chunk = self.cfg.loss_chunk_tokens
        mtp = {} if mtp_labels is None else {"mtp_labels": mtp_labels}
        if chunk:
            return model(tokens, labels=labels, loss_chunk_tokens=chunk, **mtp)
        return self.spec.loss(model(tokens, **mtp), labels)

    def _pipeline_forward_backward(
        self, tokens: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        """One schedule step; the first stage feeds tokens, the last computes the loss."""
        losses: list[torch.Tensor] = []
        inputs = (tokens,) if self.has_first else ()
        target = labels if self.has_last else None
        self.schedule.step(*inputs, target=target, losses=losses if self.has_last else None)
        if not self.has_last:
            return torch.zeros((), device=self.device)
        losses = [to_local_loss(x).detach() for x in losses]
        return torch.stack(losses).mean() / self._pp_loss_scale()

    def _set_grad_sync(self, enabled: bool) -> None:
        """Skip FSDP's gradient reduction on all but the last micro-batch of an accumulation."""
        for part in self.model_parts:
            if hasattr(part, "set_requires_gradient_sync"):
                part.set_requires_gradient_sync(enabled)

    def train_step(self) -> dict[str, Any]:
        start = time.perf_counter()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        self._mtp_losses: list[torch.Tensor] = []
        local_loss = self._accumulate_gradients()
        grad_norm = self._clip_and_step()
        loss = self._global_mean_loss(local_loss)
        elapsed = time.perf_counter() - start
        tokens = self.cfg.global_batch_size * self.cfg.seq_len
        self.train_state.step += 1
        self.train_state.tokens_seen += tokens
        if self.step == 1 and self.cfg.parallel.compile:
            # torch.compile runs inside the first forward and backward: most of this step
            log.info("step 1 took %.1f s, torch.compile of each block included", elapsed)
        metrics = self._metrics(loss, grad_norm, tokens / elapsed, elapsed)
        if self._mtp_losses:
            metrics["mtp_loss"] = self._global_mean_loss(torch.stack(self._mtp_losses).mean())
        return metrics

    def _accumulate_gradients(self) -> torch.Tensor:
        """Forward and backward over grad_accum micro-batches; returns their mean local loss.
        Under pipeline parallelism they all go through one schedule step (one gradient
        reduction per optimizer step)."""
        loss_sum = torch.zeros((), device=self.device)
        rounds = 1 if self._accumulates_in_schedule() else self.grad_accum
        for micro in range(rounds):
            tokens, labels = self._next_batch()
            if self.dims.cp_enabled:
                tokens, labels = shard_for_context_parallel(tokens, labels, self.dims.mesh("cp"))
            self._set_grad_sync(micro == rounds - 1)
            loss_sum += self._forward_backward(tokens, labels).float()
        return loss_sum / rounds

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch, or under pipeline parallelism all grad_accum of them concatenated."""
        n = self.grad_accum if self._accumulates_in_schedule() else 1
        batches = [next(self._batches) for _ in range(n)]
        tokens = torch.cat([t for t, _ in batches]) if n > 1 else batches[0][0]
        labels = torch.cat([y for _, y in batches]) if n > 1 else batches[0][1]
        # Non-blocking from the loader's pinned batches on CUDA; a plain copy otherwise.
        return tokens.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def _clip_and_step(self) -> torch.Tensor:
        """Unscale, clip by the global norm, step the optimizers (unless fp16 overflowed) and
        the schedules; returns the global grad norm."""

        self._lr = self.lr_schedulers[0].get_last_lr()[0]  # the lr this step uses
        params = [p for part in self.model_parts for p in part.parameters()]
        self.scaler.unscale_(params)
        dense, expert_sq = split_for_grad_norm(self.model_parts)
        grad_norm = global_grad_norm(
            dense,
            pp_mesh=self.dims.mesh("pp") if self.dims.pp_enabled else None,
            extra_sq=expert_sq,
        )
        if self.cfg.optimizer.grad_clip is not None:
            clip_grads_(params, self.cfg.optimizer.grad_clip, grad_norm)
        if self.scaler.update(grad_norm):
            for opt in self.optimizers:
                opt.step()
            if self.fp8_all_gather:
                precompute_float8_scales(self.model_parts)
        self._balance_routers()
        for sched in self.lr_schedulers:
            sched.step()
        return grad_norm

    def _balance_routers(self) -> None:
        """Aux-loss-free balancing: move sigmoid routers' biases by this step's expert loads,
        summed over the ranks that saw different tokens."""
        model = self.cfg.model
        if model.router_score != "sigmoid":
            return
        spread = self.dims.world_mesh is not None and self.dims.dp_size * self.dims.cp > 1
        group = self.dims.mesh("dp_cp").get_group() if spread else None
        update_router_biases(self.model_parts, model.router_bias_update_rate, group)

    def _metrics(
        self, loss: float, grad_norm: torch.Tensor, tokens_per_s: float, elapsed: float
    ) -> dict[str, Any]:
        mfu = None
        if self.peak_flops:
            mfu = self.flops_per_token * tokens_per_s / (self.peak_flops * self.dims.world_size)
        return {
            "step": self.step,
            "loss": loss,
            "grad_norm": float(grad_norm),
            "lr": self._lr,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "peak_mem_gb": peak_memory_gb(),
            "tokens_seen": self.tokens_seen,
            "step_time_s": elapsed,
        }

    # -- validation ---------------------------------------------------------------------------

    def eval_batch(self, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """This rank's held-out loss on one micro-batch (under pp: one schedule step's worth),
        forward only; 0 off the last pipeline stage."""
        tokens, labels = (t.to(self.device) for t in batch[:2])
        if self.dims.cp_enabled:
            tokens, labels = shard_for_context_parallel(tokens, labels, self.dims.mesh("cp"))
        with (
            autocast_context(self.cfg.precision, self.device.type, self.distributed),
            fp8_context(self.cfg),
            loss_parallel_context(self.loss_parallel),
        ):
            if not self.dims.pp_enabled:
                loss = self._token_loss(self.model_parts[0], tokens, labels)
                return {"val_loss": to_local_loss(loss)}
            losses: list[torch.Tensor] = []
            inputs = (tokens,) if self.has_first else ()
            target = labels if self.has_last else None
            self.schedule.eval(*inputs, target=target, losses=losses if self.has_last else None)
        if not self.has_last:
            return {"val_loss": torch.zeros((), device=self.device)}
        loss = torch.stack([to_local_loss(x) for x in losses]).mean() / self._pp_loss_scale()
        return {"val_loss": loss}

    def reduce_eval(self, values: dict[str, torch.Tensor]) -> dict[str, float]:
        """Held-out values averaged over ranks as the training loss is."""
        return {k: self._global_mean_loss(v) for k, v in values.items()}

    def _global_mean_loss(self, local: torch.Tensor) -> float:
        """Average over data and context ranks; pipeline ranks off the last stage contribute 0."""
        if not self.distributed:
            return float(local)
        total = local.detach().clone()
        dist.all_reduce(total)
        return float(total) / self.dims.loss_ranks

    # -- the loop ---------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        if not self.model_parts:
            self.setup()
        try:
            while self.step < self.cfg.steps:
                metrics = self.train_step()
                if self.validator is not None and self.validator.due(self.step):
                    metrics.update(self.validator.run())  # every rank: it is collective
                self.history.append(metrics)
                self._log(metrics)
                if self.on_step is not None:
                    self.on_step(metrics)
                if self.checkpointer is not None:
                    self.checkpointer.save(self.step)
        finally:
            if self.checkpointer is not None:
                self.checkpointer.close()
        return self.history

    def _log(self, m: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        eta = self._clock.eta(m["step"])
        if m["step"] % self.cfg.log_every == 0 or m["step"] == self.cfg.steps or "val_loss" in m:
            log.info("%s", progress_line(m, self.cfg.steps, eta))
        if self.cfg.metrics_file:
            with open(self.cfg.metrics_file, "a") as f:
                f.write(json.dumps(m) + "\n")
