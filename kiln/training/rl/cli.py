"""`kiln grpo` (GRPO-family RL) and `kiln distill` (on-policy distillation), rollouts on Kiln's
engine, from a YAML (+ --set), one line per step."""

from __future__ import annotations

import argparse

from kiln.platform import console
from kiln.platform.runtime import Runtime


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "grpo", help="GRPO/DAPO/GSPO with verifiable rewards, rollouts on kiln's engine"
    )
    p.add_argument("--config", required=True, help="YAML: GRPORunConfig fields (or a grpo: block)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", "--output", required=True, help="the Checkpoint folder to write")
    p.set_defaults(func=_grpo)

    p = sub.add_parser(
        "distill", help="on-policy distillation: the student samples, a teacher scores its tokens"
    )
    p.add_argument(
        "--config", required=True, help="YAML: DistillRunConfig fields (or a distill: block)"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", "--output", required=True, help="the Checkpoint folder to write")
    p.set_defaults(func=_distill)


def _on_ray_if_asked(workers: int, run):
    """run() in this process, or with Ray up for `workers` rollout actors: attached to
    RAY_ADDRESS, else an embedded local Ray shut down afterwards."""
    if not workers:
        return run()
    runtime = Runtime().ensure()
    try:
        return run()
    finally:
        runtime.shutdown()  # only a Ray started here


def _grpo(args) -> int:
    # the run pulls in torch and the engine (~7 s): only `kiln grpo` pays that, not every
    # command's start (as kiln/training/post/cli.py's `sft`)
    from kiln.training.rl.grpo import format_step
    from kiln.training.rl.run import load_config, run_grpo

    cfg = load_config(args.config, args.overrides)
    summary = _on_ray_if_asked(
        cfg.rollout.workers,
        lambda: run_grpo(cfg, args.out, on_step=lambda m: print(format_step(m), flush=True)),
    )
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


def _distill(args) -> int:
    # as _grpo: torch and the engine load only when this command runs
    from kiln.training.rl.distill import format_distill_step
    from kiln.training.rl.distill_run import load_distill_config, run_distill

    cfg = load_distill_config(args.config, args.overrides)
    summary = _on_ray_if_asked(
        cfg.rollout.workers,
        lambda: run_distill(
            cfg, args.out, on_step=lambda m: print(format_distill_step(m), flush=True)
        ),
    )
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
