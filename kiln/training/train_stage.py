"""The `train` stage: tokens (optional; synthetic data without) -> a checkpoint root with `latest`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.config import TrainConfig
from kiln.training.ray_train import RayOptions


class TrainStageConfig(TrainConfig, StageConfig):
    """A TrainConfig plus how to lay the job out on Ray (`ray.max_failures`, `ray.cpus_per_worker`, ...)."""

    ray: RayOptions = Field(default_factory=RayOptions)

    def train_config(self) -> TrainConfig:
        return TrainConfig.model_validate(self.model_dump(exclude={"ray"}, by_alias=True))


class TrainStage(Stage):
    type_name = "train"
    Config = TrainStageConfig
    input_kinds: ClassVar[dict[str, str]] = {"tokens": "TokenDataset"}
    optional_inputs = frozenset({"tokens"})
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}

    def run(self, ctx: StageContext) -> dict[str, Any]:
        from kiln.training.ray_train import train_on_ray

        cfg = self.config.train_config()
        if "tokens" in ctx.inputs:
            data = cfg.data.model_copy(
                update={"paths": [ctx.inputs["tokens"].path], "synthetic": False}
            )
            cfg = cfg.model_copy(update={"data": data})
        out = ctx.outputs["checkpoint"]
        cfg = cfg.model_copy(
            update={"checkpoint": cfg.checkpoint.model_copy(update={"dir": out.path})}
        )
        summary = train_on_ray(
            cfg, run_dir=str(ctx.stage_dir), options=self.config.ray, runtime=ctx.ray()
        )
        final = summary["final"] or {}
        out.counts = {
            "steps": final.get("step", cfg.steps),
            "tokens_seen": final.get("tokens_seen", 0),
        }
        out.meta = {
            "latest": summary["checkpoint"],
            "model": cfg.model.model_dump(mode="json"),
            "parallel": cfg.parallel.model_dump(mode="json"),
            "metrics_file": summary["metrics_file"],
            "loss_curve": summary["loss_curve"],
        }
        return {
            "final_loss": final.get("loss"),
            "steps": final.get("step"),
            "world_size": summary["world_size"],
            "wall_s": round(summary["wall_s"], 2),
        }
