"""Everything a training run needs, as typed config (YAML `train:` blocks validate into this)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.model.config import ModelConfig
from kiln.platform.errors import ConfigError
from kiln.training.checkpoint.config import CheckpointConfig
from kiln.training.data.config import DataConfig

# Each fp8 backend's scaling recipes, its default first
FP8_RECIPES = {"torchao": ("tensorwise", "rowwise"), "te": ("delayed", "current")}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParallelConfig(_Strict):
    """Mesh sizes (their product is the world size) and pipeline settings.

    `kiln.training.parallel.dims.ParallelDims` resolves and validates them against a world size.
    """

    pp: int = Field(1, ge=1, description="Pipeline-parallel stages.")
    dp_replicate: int = Field(
        1, ge=1, description="Data-parallel replicas (DDP / HSDP's replicate dim)."
    )
    dp_shard: int = Field(-1, ge=-1, description="-1: whatever the other dims leave of the world.")
    cp: int = Field(1, ge=1, description="Context parallel: ranks splitting each sequence.")
    tp: int = Field(1, ge=1, description="Tensor parallel: ranks splitting each matrix.")
    ep: int = Field(1, ge=1, description="Expert parallel; borrows the dp_shard (x cp) ranks.")
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b", "zbv"] = Field(
        "1f1b", description="Pipeline schedule (torch.distributed.pipelining)."
    )
    pp_microbatches: int | None = Field(
        None, ge=1, description="Default: pp (one micro-batch per pipeline rank)."
    )
    pp_virtual_stages: int = Field(
        1, ge=1, description="Stages per rank (interleaved_1f1b; zbv uses 2)."
    )
    reshard_after_forward: bool = Field(
        False, description="FSDP2: False = distributed optimizer (ZeRO-2 like), True = ZeRO-3."
    )
    loss_parallel: bool = Field(True, description="Cross entropy on the TP-sharded vocabulary.")
    compile: bool | None = Field(
        None,
        description="torch.compile each transformer block (after TP and recompute, before "
        "FSDP); null: on for CUDA runs, off on CPU.",
    )


class OptimizerConfig(_Strict):
    lr: float = Field(3e-4, gt=0, description="Peak learning rate (after warmup).")
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW's (beta1, beta2).")
    eps: float = Field(1e-8, description="AdamW's epsilon.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW's decoupled weight decay.")
    grad_clip: float | None = Field(
        1.0, gt=0, description="Max global grad norm (None: no clipping)."
    )
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = Field(
        "auto", description="AdamW kernel: auto picks fused where the tensors allow, else foreach."
    )


class ScheduleConfig(_Strict):
    kind: Literal["cosine", "wsd", "constant"] = Field(
        "cosine",
        description="Learning-rate shape after warmup: cosine, warmup-stable-decay, or constant.",
    )
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warmup from 0 to optimizer.lr.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final learning rate as a share of optimizer.lr."
    )
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="WSD: share of the steps spent decaying."
    )


class TrainConfig(_Strict):
    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig.preset("tiny"),
        description="Model shape: a preset name (`tiny`, `125m`, `1b`, `llama3_8b`) or fields.",
    )
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig,
        description="Parallel layout: pp x dp_replicate x dp_shard x cp x tp ranks.",
    )
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="AdamW settings."
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="Learning-rate schedule."
    )
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = Field(
        "auto", description="auto: bf16 on CUDA, fp32 on CPU."
    )
    fp8_backend: Literal["torchao", "te"] = Field(
        "torchao",
        description="precision fp8: torchao's Float8Linear (torch._scaled_mm; composes with "
        "FSDP2, TP and PP) or Transformer Engine's te.Linear (dp/cp/ep only).",
    )
    fp8_recipe: Literal["tensorwise", "rowwise", "delayed", "current"] | None = Field(
        None,
        description="precision fp8: scaling recipe. torchao: tensorwise (default) or rowwise; "
        "te: delayed (default) or current.",
    )
    fp8_all_gather: bool = Field(
        False,
        description="precision fp8 (torchao, tensorwise) under FSDP2: all-gather the weights in "
        "fp8 (half bf16's traffic), their scales from one all-reduce after each optimizer step.",
    )
    recompute: Literal["none", "selective", "full"] = Field(
        "none",
        description="Activation checkpointing: none, selective (see selective_recompute) or full.",
    )
    selective_recompute: Literal["op", "attention"] = Field(
        "op",
        description="op: keep matmul/attention outputs, recompute the rest; attention: the core.",
    )
    activation_offload: bool = Field(
        False, description="Keep saved activations in host memory between forward and backward."
    )
    activation_offload_layers: int | None = Field(
        None,
        gt=0,
        description="With activation_offload: only the first this many blocks (None: all), "
        "whose activations wait longest for backward.",
    )
    loss_chunk_tokens: int = Field(
        0,
        ge=0,
        description="Compute the output head and cross entropy this many tokens at a time, so "
        "the full logits never exist (0: the plain head, then cross entropy).",
    )
    optimizer_offload: bool = Field(
        False, description="FSDP2 CPUOffloadPolicy: params, grads, Adam on CPU."
    )
    seq_len: int = Field(128, gt=0, description="Tokens per training sequence.")
    global_batch_size: int = Field(
        8, gt=0, description="Sequences per optimizer step, over all data-parallel ranks."
    )
    micro_batch_size: int = Field(
        2,
        gt=0,
        description="Sequences per forward pass on one rank (gradient accumulation: the rest).",
    )
    steps: int = Field(10, ge=0, description="Optimizer steps to train for.")
    seed: int = Field(0, description="Seed of initialization and data order.")
    meta_init: bool = Field(
        True,
        description="Build on the meta device and allocate only each rank's shards after "
        "carving and sharding (False: every rank builds the full model first).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when available, else CPU."
    )
    peak_tflops: float | None = Field(
        None, gt=0, description="Device peak for MFU (default: known GPUs)."
    )
    data: DataConfig = Field(
        default_factory=lambda: DataConfig(synthetic=True),
        description="Training data (token datasets, blend, splits) or synthetic tokens.",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig,
        description="Where and how often checkpoints are written and loaded.",
    )
    eval_interval: int = Field(
        0, ge=0, description="Validate every N steps and after the last (0: never)."
    )
    eval_batches: int = Field(
        4, ge=1, description="Micro-batches per data-parallel rank in each validation."
    )
    eval_split: str = Field(
        "valid", description="The split validated on (a sibling of data.split: train/valid/test)."
    )
    log_every: int = Field(1, ge=1, description="Log metrics every this many steps.")
    metrics_file: str | None = Field(None, description="Append one JSON line of metrics per step.")

    @field_validator("model", mode="before")
    @classmethod
    def _preset(cls, value):
        """`model: tiny` or `model: {preset: 1b, n_layers: 4}` name a preset (with overrides)."""
        if isinstance(value, str):
            return ModelConfig.preset(value)
        if isinstance(value, dict) and "preset" in value:
            value = dict(value)
            return ModelConfig.preset(value.pop("preset"), **value)
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.seq_len > self.model.max_seq_len:
            raise ConfigError(
                f"seq_len ({self.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})"
            )
        if self.activation_offload_layers is not None and not self.activation_offload:
            raise ConfigError("activation_offload_layers needs activation_offload: true")
        if self.parallel.pp > 1 and self.model.tie_embeddings:
            raise ConfigError(
                "model.tie_embeddings is not supported with parallel.pp > 1 "
                "(first and last stage differ)"
            )
        if self.model.mla is not None and self.parallel.cp > 1:
            # ring attention takes one head width for q, k and v; MLA's keys are wider than
            # its values, and it would ring the expanded keys rather than the latent
            raise ConfigError(
                "model.mla (Multi-head Latent Attention) is not supported with parallel.cp > 1; "
                "use dp_shard, tp, ep or pp"
            )
        m = self.model
        if self.parallel.pp > 1 and m.router_score == "sigmoid" and m.router_bias_update_rate:
            # measured: torch's pipeline stage trains on one extra forward in its first step,
            # whose expert loads would move the biases away from one process's
            raise ConfigError(
                "model.router_bias_update_rate > 0 is not supported with parallel.pp > 1; "
                "set it to 0 (a fixed router bias) to pipeline a sigmoid-routed MoE"
            )
        if self.parallel.cp > 1:
            # ring attention scales by 1/sqrt(head_dim) and caps nothing
            for field in ("query_pre_attn_scalar", "attn_logit_softcap"):
                if getattr(self.model, field) is not None:
                    raise ConfigError(f"model.{field} is not supported with parallel.cp > 1")
        if self.model.mtp_depth:
            self._check_mtp_layout()
        self._check_fp8_recipe()
        if self.loss_chunk_tokens and self.parallel.pp > 1:
            # the last stage hands logits to the schedule's loss function
            raise ConfigError(
                "loss_chunk_tokens is not supported with parallel.pp > 1; set it to 0 there"
            )
        return self

    def _check_fp8_recipe(self) -> None:
        """fp8_recipe names one of its backend's recipes (None: the backend's default)."""
        recipes = FP8_RECIPES[self.fp8_backend]
        if self.fp8_recipe is not None and self.fp8_recipe not in recipes:
            raise ConfigError(
                f"fp8_recipe={self.fp8_recipe} is not a recipe of fp8_backend={self.fp8_backend} "
                f"(use one of {', '.join(recipes)})"
            )
        one_scale_per_weight = self.fp8_backend == "torchao" and self.fp8_scaling == "tensorwise"
        if self.fp8_all_gather and not one_scale_per_weight:
            raise ConfigError(
                "fp8_all_gather needs fp8_backend: torchao and fp8_recipe: tensorwise "
                "(one scale per weight)"
            )

    @property
    def fp8_scaling(self) -> str:
        """The fp8 recipe in effect: fp8_recipe, else its backend's default."""
        return self.fp8_recipe or FP8_RECIPES[self.fp8_backend][0]

    def _check_mtp_layout(self) -> None:
        """Multi-token prediction trains in one process and under dp_shard / dp_replicate / ep.
        pp: its modules need the first stage's embedding on the last stage; tp and cp: they
        shift tokens along a sequence that those layouts split, and have no sharding plan."""
        for dim in ("pp", "tp", "cp"):
            if getattr(self.parallel, dim) > 1:
                raise ConfigError(
                    f"model.mtp_depth > 0 (multi-token prediction) is not supported with "
                    f"parallel.{dim} > 1; use dp_shard, dp_replicate or ep, or set mtp_depth: 0"
                )

    def grad_accum_steps(self, dp_size: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank."""
        per_rank, rest = divmod(self.global_batch_size, self.micro_batch_size * dp_size)
        if rest or per_rank == 0:
            raise ConfigError(
                f"global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"micro_batch_size*dp ({self.micro_batch_size}*{dp_size})"
            )
        return per_rank
