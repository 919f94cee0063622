"""The handlers of `kiln grpo` and `kiln rl-task` (imported only when one runs)."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from kiln.platform import console
from kiln.platform.errors import ConfigError, format_validation_error
from kiln.training.rl.grpo import format_step
from kiln.training.rl.run import load_config, run_grpo
from kiln.training.rl.tasks.arithmetic import ArithmeticConfig, write_splits


def grpo_command(args) -> int:
    cfg = load_config(args.config, args.overrides)
    summary = run_grpo(cfg, args.out, on_step=lambda m: print(format_step(m), flush=True))
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
