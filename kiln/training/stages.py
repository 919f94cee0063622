"""The `train` stage: tokens (optional; synthetic data without) -> a checkpoint root with
`latest`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from kiln.model.config import ModelConfig
from kiln.model.formats.checkpoint import read_sidecar, resolve
from kiln.model.formats.checkpoint_tokenizer import copy_tokenizer
from kiln.platform.console import follow_metrics
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.checkpoint import latest_checkpoint
from kiln.training.config import TrainConfig
from kiln.training.data.stages import TokenizeStage
from kiln.training.metrics_log import METRICS_FILE
from kiln.training.post.stages import DPOStage, ImportModelStage, PrepareChatStage, SFTStage
from kiln.training.preflight import launch_plan
from kiln.training.ray_train import RayOptions, train_on_ray, world_size
from kiln.training.rl.stages import DistillStage, GRPOStage

# the area's stages, those of its sub-packages too (kiln/stages.py names them here)
__all__ = [
    "DistillStage",
    "DPOStage",
    "GRPOStage",
    "ImportModelStage",
    "PrepareChatStage",
    "SFTStage",
    "TokenizeStage",
    "TrainStage",
]


class TrainStageConfig(TrainConfig, StageConfig):
    """A TrainConfig plus how to lay the job out on Ray (`ray.max_failures`,
    `ray.cpus_per_worker`, ...)."""

    ray: RayOptions = Field(
        default_factory=RayOptions,
        description="How the job is laid out on Ray (workers, CPUs/GPUs each, retries).",
    )

    def train_config(self) -> TrainConfig:
        return TrainConfig.model_validate(self.model_dump(exclude={"ray"}, by_alias=True))


def continue_from_model(cfg: TrainConfig, checkpoint: str) -> TrainConfig:
    """Continued pretraining of a Checkpoint (import-model, train, sft): its weights to start
    from (`checkpoint.init_from`, read in place) and its shape as `model:`, but for `model:`'s
    multi-token prediction when it sets `mtp_depth` > 0 (a training option: modules the
    checkpoint lacks start from their init) and its `fused_projections`."""
    sidecar = read_sidecar(checkpoint)
    if sidecar.get("adapter_only"):
        raise InputError(
            f"{checkpoint}: an adapter-only checkpoint (LoRA); continued pretraining starts from "
            "full weights: train from its base, or export it and import the export"
        )
    model_cfg = ModelConfig(**sidecar["model"])
    if model_cfg.max_seq_len < cfg.seq_len:
        model_cfg = model_cfg.model_copy(update={"max_seq_len": cfg.seq_len})
    if cfg.model.mtp_depth:
        mtp = {k: getattr(cfg.model, k) for k in ("mtp_depth", "mtp_loss_weight")}
        model_cfg = model_cfg.model_copy(update=mtp)
    # an in-memory layout (fused projections) is this run's choice, not the checkpoint's
    model_cfg = model_cfg.model_copy(update={"fused_projections": cfg.model.fused_projections})
    init = cfg.checkpoint.model_copy(update={"init_from": resolve(checkpoint)})
    continued = cfg.model_copy(update={"model": model_cfg, "checkpoint": init})
    # validated again: the checkpoint's shape meets the layout here (MLA under cp, MTP under tp)
    return TrainConfig.model_validate(continued.model_dump(by_alias=True))


class TrainStage(Stage):
    """Pretrain (or continue training) a model on a TokenDataset on Ray Train, any layout."""

    type_name = "train"
    Config = TrainStageConfig
    input_kinds: ClassVar[dict[str, str]] = {"tokens": "TokenDataset", "model": "Checkpoint"}
    optional_inputs = frozenset({"tokens", "model"})  # model: continue pretraining it
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}

    def needs(self) -> Resources:
        """Ray, and one GPU per worker when `ray.use_gpu` is set."""

        options = self.config.ray
        gpus = world_size(self.config.train_config(), options) if options.use_gpu else 0
        return Resources(ray=True, gpus=gpus)

    def preflight(self, runtime, wired: frozenset[str]) -> None:
        """The layout, the device and the workers' CPUs/GPUs (kiln.training.preflight)."""

        try:  # a `model` input brings its own shape: checked once it is read
            launch_plan(
                self.config.train_config(),
                self.config.ray,
                runtime.planned_resources(),
                model_known="model" not in wired,
            )
        except ConfigError as exc:
            raise ConfigError(f"{self.name}.{exc}") from None

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg = self.config.train_config()
        if "tokens" in ctx.inputs:
            paths = [ctx.inputs["tokens"].path]
            cfg = cfg.model_copy(
                update={"data": cfg.data.model_copy(update={"paths": paths, "synthetic": False})}
            )
        out = ctx.outputs["checkpoint"]
        # The pipeline clears a failed stage's outputs, so checkpoints go to the platform's work
        # folder (kept across failed attempts of the same stage): a re-run after a crash resumes
        # there, under the same Ray run. On success they move into the output artifact (renames).
        work = Path(ctx.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        if "model" in ctx.inputs:
            cfg = continue_from_model(cfg, ctx.inputs["model"].path)
        ckpt_root = str(work / "checkpoints")
        cfg = cfg.model_copy(
            update={"checkpoint": cfg.checkpoint.model_copy(update={"dir": ckpt_root})}
        )
        options = self.config.ray
        if options.storage_path is None:
            options = options.model_copy(update={"storage_path": str(work / "ray")})

        # quiet mode: the workers' step lines stay in their logs; progress comes from their JSONL
        with follow_metrics(str(ctx.stage_dir / METRICS_FILE), cfg.steps, self.name):
            summary = train_on_ray(
                cfg, run_dir=str(ctx.stage_dir), options=options, runtime=ctx.ray()
            )
        for entry in sorted(Path(ckpt_root).iterdir()):
            os.replace(entry, Path(out.path) / entry.name)
        if "model" in ctx.inputs:  # the model's tokenizer and chat template travel on
            copy_tokenizer(ctx.inputs["model"].path, out.path)

        final = summary["final"] or {}
        out.counts = {
            "steps": final.get("step", cfg.steps),
            "tokens_seen": final.get("tokens_seen", 0),
        }
        out.meta = {
            "latest": latest_checkpoint(out.path),
            "model": cfg.model.model_dump(mode="json"),
            "parallel": cfg.parallel.model_dump(mode="json"),
            "metrics_file": summary["metrics_file"],
            "loss_curve": summary["loss_curve"],
        }
        metrics = {
            "final_loss": final.get("loss"),
            "steps": final.get("step"),
            "world_size": summary["world_size"],
            "wall_s": round(summary["wall_s"], 2),
        }
        if summary["resumed_from_step"] is not None:  # the report says so
            metrics["resumed_from_step"] = summary["resumed_from_step"]
        return metrics
