"""The handlers of `kiln grpo`, `kiln distill` and `kiln rl-task` (imported only when one
runs)."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from kiln.platform import console
from kiln.platform.errors import ConfigError, format_validation_error
from kiln.platform.runtime import Runtime
from kiln.training.rl.distill import format_distill_step
from kiln.training.rl.distill_run import load_distill_config
from kiln.training.rl.grpo import format_step
from kiln.training.rl.layouts import layout_world_size
from kiln.training.rl.malloc_tuning import keep_freed_memory
from kiln.training.rl.ray_launch import run_anywhere
from kiln.training.rl.run import load_config
from kiln.training.rl.tasks.arithmetic import ArithmeticConfig, write_splits


def _run(objective: str, cfg, out: str, on_step):
    """The run in this process, or with Ray up for rollout actors or a layout's Ray Train
    workers: attached to RAY_ADDRESS, else an embedded local Ray shut down afterwards."""
    if not cfg.rollout.workers and layout_world_size(cfg.parallel, f"{objective}.parallel") == 1:
        return run_anywhere(objective, cfg, out, on_step)
    runtime = Runtime().ensure()
    try:
        return run_anywhere(objective, cfg, out, on_step, runtime=runtime)
    finally:
        runtime.shutdown()  # only a Ray started here


def grpo_command(args) -> int:
    cfg = load_config(args.config, args.overrides)
    keep_freed_memory()  # every step reuses the last one's memory (malloc_tuning.py)
    summary = _run("grpo", cfg, args.out, lambda m: print(format_step(m), flush=True))
    final = summary["final"]
    console.summary(
        [
            ("steps", summary["steps"]),
            ("first reward", summary["first_reward"]),
            ("final reward", final["reward"]),
            ("held-out reward before", summary["eval_reward_before"]),
            ("held-out reward after", summary["eval_reward_after"]),
            ("seconds", round(summary["seconds"], 1)),
            ("checkpoint", args.out),
        ]
    )
    return 0


def distill_command(args) -> int:
    cfg = load_distill_config(args.config, args.overrides)
    keep_freed_memory()  # every step reuses the last one's memory (malloc_tuning.py)
    summary = _run("distill", cfg, args.out, lambda m: print(format_distill_step(m), flush=True))
    console.summary(
        [
            ("steps", summary["steps"]),
            ("first reverse KL", summary["first_reverse_kl"]),
            ("final reverse KL", summary["final"]["reverse_kl"]),
            ("held-out reverse KL before", summary["eval_reverse_kl_before"]),
            ("held-out reverse KL after", summary["eval_reverse_kl_after"]),
            ("steps/s", round(summary["steps_per_s"], 3)),
            ("seconds", round(summary["seconds"], 1)),
            ("checkpoint", args.out),
        ]
    )
    return 0


def arithmetic_command(args: argparse.Namespace) -> int:
    fields = {
        "seed": args.seed,
        "digits": args.digits,
        "terms": args.terms,
        "operations": list(args.operations),
        "train": args.train,
        "held_out": args.held_out,
    }
    try:
        cfg = ArithmeticConfig.model_validate(fields)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix="rl-task arithmetic")) from None
    paths = write_splits(cfg, args.out)
    console.summary(
        [
            ("train", f"{cfg.train} prompts  {paths['train']}"),
            ("held_out", f"{cfg.held_out} prompts  {paths['held_out']}"),
        ]
    )
    return 0
