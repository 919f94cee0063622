"""`kiln grpo` (GRPO-family RL) and `kiln distill` (on-policy distillation), rollouts on Kiln's
engine, from a YAML (+ --set), one line per step; `parallel:` runs the ranks on Ray Train."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "grpo", help="GRPO/DAPO/GSPO with verifiable rewards, rollouts on kiln's engine"
    )
    p.add_argument("--config", required=True, help="YAML: GRPORunConfig fields (or a grpo: block)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a field, e.g. steps=50 or grpo.parallel.dp_shard=2 (Ray Train workers, one a rank)",
    )
    p.add_argument("--out", "--output", required=True, help="the Checkpoint folder to write")
    p.set_defaults(handler="kiln.training.rl.commands:grpo_command")

    p = sub.add_parser(
        "distill", help="on-policy distillation: the student samples, a teacher scores its tokens"
    )
    p.add_argument(
        "--config", required=True, help="YAML: DistillRunConfig fields (or a distill: block)"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", "--output", required=True, help="the Checkpoint folder to write")
    p.set_defaults(handler="kiln.training.rl.commands:distill_command")
