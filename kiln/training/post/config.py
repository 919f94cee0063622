"""Post-training configs: a TrainConfig plus the objective, the base model and LoRA."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kiln.model.lora import LoRAConfig
from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.post.dpo import DPOConfig
from kiln.training.post.logit_distill import LogitDistillConfig


class PostTrainConfig(TrainConfig):
    """Every TrainConfig field (layout, optimizer, schedule, checkpoint, ...) plus:"""

    objective: Literal["sft", "dpo"] = Field("sft", description="sft: masked next-token loss; dpo.")
    base: str | None = Field(
        None,
        description="Starting weights: a HF model folder or Hub id (org/name[@revision]), an "
        "export, or a kiln checkpoint. The model shape comes from it (model: is ignored).",
    )
    lora: LoRAConfig | None = Field(None, description="Train low-rank adapters only (None: full).")
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="DPO settings (objective dpo).")
    distill: LogitDistillConfig | None = Field(
        None, description="SFT with a teacher's logits on the same data (logit distillation)."
    )

    @model_validator(mode="after")
    def _check_layout(self) -> PostTrainConfig:
        p = self.parallel
        if self.objective == "dpo" and p.pp > 1:
            raise ConfigError("dpo with parallel.pp > 1 is not supported (use fsdp/tp)")
        if self.objective == "dpo" and p.cp > 1:
            raise ConfigError("dpo with parallel.cp > 1 is not supported (sequences are short)")
        if self.loss_chunk_tokens:
            # SFT's head already runs on the trained tokens only; DPO needs per-token log-probs.
            raise ConfigError("loss_chunk_tokens applies to pretraining; set it to 0 here")
        if self.lora is not None and self.precision == "fp8":
            raise ConfigError("lora with precision fp8 is not supported")
        if self.distill is not None:
            if self.objective != "sft":
                raise ConfigError("distill: logit distillation is an sft option (objective sft)")
            if p.pp > 1 or p.cp > 1 or p.tp > 1:
                raise ConfigError(
                    "distill with parallel.pp, cp or tp > 1 is not supported (the teacher runs "
                    "whole on every rank: use dp_shard / dp_replicate)"
                )
        if self.dpo.reference == "adapters_disabled" and self.lora is None:
            raise ConfigError("dpo.reference adapters_disabled needs lora: (or use precomputed)")
        return self
