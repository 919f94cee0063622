"""`kiln plan SPEC_OR_TRAIN_YAML [--set K=V] [--world N] [--ranks 0,-1]`: a table, one row per
planned rank, after a progress line per rank on stderr (each takes seconds to a minute)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", help="pipeline specs or TrainConfig YAMLs")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field as `kiln run` (STAGE.FIELD=VALUE) or `kiln train` (FIELD=VALUE) do",
    )
    parser.add_argument("--world", type=int, help="world size (default: the layout's product)")
    parser.add_argument("--ranks", default="0,-1", help="ranks to plan (-1: the last)")
    parser.add_argument(
        "--shrink", action="store_true", help="small matrices, same layout: a quick build check"
    )


def register(subparsers) -> None:
    """`kiln plan`: build a layout as chosen ranks of its world size and step it on fake ranks."""
    p = subparsers.add_parser(
        "plan",
        help="per-rank memory, FLOPs and tokens of a training layout at its real world size",
    )
    add_arguments(p)
    p.set_defaults(handler="kiln.training.plan.commands:plan_command")
