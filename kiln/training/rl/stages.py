"""The `grpo` stage: an ExportedModel (import-model, sft, export) and a prompt file -> a
Checkpoint (LoRA merged, tokenizer beside it) that `export` then `serve` take."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from kiln.platform.console import Progress
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.metrics_log import MetricsWriter
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.grpo import format_step
from kiln.training.rl.run import run_grpo


class GRPOStageConfig(GRPORunConfig, StageConfig):
    """GRPORunConfig fields; `base` comes from the `model` input when wired."""


class GRPOStage(Stage):
    """GRPO-family RL with verifiable rewards, rollouts on Kiln's engine, in this process."""

    type_name = "grpo"
    Config = GRPOStageConfig
    input_kinds: ClassVar[dict[str, str]] = {"model": "ExportedModel"}
    optional_inputs = frozenset({"model"})
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg = GRPORunConfig.model_validate(self.config.model_dump())
        if "model" in ctx.inputs:
            cfg = cfg.model_copy(update={"base": ctx.inputs["model"].path})
        out = ctx.outputs["checkpoint"]
        writer = MetricsWriter(str(ctx.stage_dir))
        with Progress(cfg.steps, self.name, unit="steps") as progress:

            def on_step(m: dict) -> None:
                writer.write(m)
                progress.update(int(m["step"]), format_step(m))

            try:
                summary = run_grpo(cfg, out.path, on_step=on_step)
            finally:
                writer.close()
        final = summary["final"]
        out.counts = {"steps": summary["steps"]}
        out.meta = {"objective": "grpo", "lora": cfg.lora is not None, "final": final}
        return {
            "steps": summary["steps"],
            "first_reward": summary["first_reward"],
            "final_reward": final["reward"],
            "eval_reward_before": summary["eval_reward_before"],
            "eval_reward_after": summary["eval_reward_after"],
            "run": os.path.join(out.path, "run.json"),
        }
