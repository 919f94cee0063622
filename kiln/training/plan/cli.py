"""`kiln plan SPEC_OR_TRAIN_YAML [--world N] [--ranks 0,-1]`: one line per planned rank."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", help="pipeline specs or TrainConfig YAMLs")
    parser.add_argument("--world", type=int, help="world size (default: the layout's product)")
    parser.add_argument("--ranks", default="0,-1", help="ranks to plan (-1: the last)")
    parser.add_argument(
        "--shrink", action="store_true", help="small matrices, same layout: a quick build check"
    )


def run(args: argparse.Namespace) -> int:
    """Print one line per planned rank; a KilnError propagates as the real run's one-liner."""
    from kiln.training.plan.configs import cpu_stand_in, train_configs, world_size_of
    from kiln.training.plan.memory import plan_rank

    for name, cfg in (c for spec in args.specs for c in train_configs(spec)):
        world = args.world or world_size_of(cfg)
        stand_in = cpu_stand_in(cfg, shrink=args.shrink)
        for r in (int(x) for x in args.ranks.split(",")):
            info = plan_rank(stand_in, r % world, world)
            print(f"{name}: " + " ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    return 0


def register(subparsers) -> None:
    """`kiln plan`: build a layout as chosen ranks of its world size and step it on fake ranks."""
    p = subparsers.add_parser(
        "plan",
        help="per-rank memory, FLOPs and tokens of a training layout at its real world size",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    from kiln.platform.errors import KilnError

    parser = argparse.ArgumentParser(prog="python -m kiln.training.plan")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
