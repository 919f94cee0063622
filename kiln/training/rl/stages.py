"""The `grpo` and `distill` stages: a Checkpoint (import-model, train, sft, dpo) and a prompt
file (and, for `distill`, a teacher) -> a Checkpoint (LoRA merged, tokenizer beside it) that
`export` then `serve` take. Both run in this process unless `rollout.workers` asks for Ray
rollout actors or `parallel:` for several ranks (one Ray Train worker each: ray_launch.py)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from kiln.platform.console import Progress
from kiln.platform.runtime import Resources
from kiln.platform.stage import Stage, StageConfig, StageContext
from kiln.training.config import ParallelConfig
from kiln.training.metrics_log import MetricsWriter
from kiln.training.rl.config import GRPORunConfig, RolloutConfig
from kiln.training.rl.distill import format_distill_step
from kiln.training.rl.distill_config import DistillRunConfig
from kiln.training.rl.grpo import format_step
from kiln.training.rl.layouts import layout_world_size
from kiln.training.rl.ray_launch import run_anywhere


def rollout_resources(rollout: RolloutConfig, parallel: ParallelConfig | None) -> Resources:
    """No Ray for in-process rollouts in one process; Ray and the actors' CPUs for rollout
    workers; Ray for a layout's ranks (the launcher checks their CPUs against the cluster)."""
    if rollout.workers == 0 and layout_world_size(parallel) == 1:
        return Resources(ray=False)
    return Resources(ray=True, cpus=rollout.workers * rollout.cpus_per_worker)


def _runtime(ctx: StageContext, parallel: ParallelConfig | None):
    """The run's Ray when the layout puts the ranks on Ray Train, else None (not started)."""
    return ctx.ray() if layout_world_size(parallel) > 1 else None


def _state_dir(ctx: StageContext) -> str | None:
    """The platform's work folder: it survives a failed attempt, so a re-run resumes."""
    return str(ctx.work_dir) if ctx.work_dir is not None else None


class GRPOStageConfig(GRPORunConfig, StageConfig):
    """GRPORunConfig fields; `base` comes from the `model` input when wired."""


class GRPOStage(Stage):
    """GRPO-family RL with verifiable rewards, rollouts on Kiln's engine, in this process (or
    on Ray Train's workers, one per rank of `parallel:`)."""

    type_name = "grpo"
    Config = GRPOStageConfig
    input_kinds: ClassVar[dict[str, str]] = {"model": "Checkpoint"}
    optional_inputs = frozenset({"model"})
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def needs(self) -> Resources:
        return rollout_resources(self.config.rollout, self.config.parallel)

    def preflight(self, runtime, wired: frozenset[str]) -> None:
        """A layout the on-policy loops cannot take fails the run before any stage starts."""
        layout_world_size(self.config.parallel, f"{self.name}.parallel")

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
                summary = run_anywhere(
                    "grpo", cfg, out.path, on_step, _state_dir(ctx), _runtime(ctx, cfg.parallel)
                )
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


class DistillStageConfig(DistillRunConfig, StageConfig):
    """DistillRunConfig fields; `base` comes from the `model` input when wired, `teacher` from
    the `teacher` input when the spec names one (`inputs: {teacher: <stage>.<slot>}`)."""


class DistillStage(Stage):
    """On-policy distillation: the student samples on Kiln's engine, a teacher scores its tokens."""

    type_name = "distill"
    Config = DistillStageConfig
    input_kinds: ClassVar[dict[str, str]] = {"model": "Checkpoint", "teacher": "Checkpoint"}
    optional_inputs = frozenset({"model", "teacher"})
    output_kinds: ClassVar[dict[str, str]] = {"checkpoint": "Checkpoint"}
    resources: ClassVar[Resources] = Resources(ray=False)

    def needs(self) -> Resources:
        return rollout_resources(self.config.rollout, self.config.parallel)

    def preflight(self, runtime, wired: frozenset[str]) -> None:
        """A layout the on-policy loops cannot take fails the run before any stage starts."""
        layout_world_size(self.config.parallel, f"{self.name}.parallel")

    def run(self, ctx: StageContext) -> dict[str, Any]:
        cfg = DistillRunConfig.model_validate(self.config.model_dump())
        update = {}
        if "model" in ctx.inputs:
            update["base"] = ctx.inputs["model"].path
        # an unnamed teacher slot would take the latest Checkpoint, the student itself
        if "teacher" in self.inputs and "teacher" in ctx.inputs:
            update["teacher"] = ctx.inputs["teacher"].path
        cfg = cfg.model_copy(update=update)
        out = ctx.outputs["checkpoint"]
        writer = MetricsWriter(str(ctx.stage_dir))
        with Progress(cfg.steps, self.name, unit="steps") as progress:

            def on_step(m: dict) -> None:
                writer.write(m)
                progress.update(int(m["step"]), format_distill_step(m))

            try:
                summary = run_anywhere(
                    "distill", cfg, out.path, on_step, _state_dir(ctx), _runtime(ctx, cfg.parallel)
                )
            finally:
                writer.close()
        final = summary["final"]
        out.counts = {"steps": summary["steps"]}
        out.meta = {"objective": "distill", "lora": cfg.lora is not None, "final": final}
        return {
            "steps": summary["steps"],
            "first_reverse_kl": summary["first_reverse_kl"],
            "final_reverse_kl": final["reverse_kl"],
            "eval_reverse_kl_before": summary["eval_reverse_kl_before"],
            "eval_reverse_kl_after": summary["eval_reverse_kl_after"],
            "steps_per_s": summary["steps_per_s"],
            "run": os.path.join(out.path, "run.json"),
        }
