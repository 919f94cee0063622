"""`kiln plan SPEC_OR_TRAIN_YAML [--set K=V] [--world N] [--ranks 0,-1]`: a table, one row per
planned rank, after a progress line per rank on stderr (each takes seconds to a minute)."""

from __future__ import annotations

import argparse
import sys

# (column, key of plan_rank's dict, format)
COLUMNS = [
    ("stage", "name", "{}"),
    ("rank", "rank", "{}"),
    ("world", "world", "{}"),
    ("params", "local_params", "{:,}"),
    ("accum", "grad_accum", "{}"),
    ("parts", "model_parts", "{}"),
    ("tokens/step", "tokens_per_step", "{:,}"),
    ("TFLOP/rank", "tflops_per_step_per_rank", "{}"),
    ("in flight", "in_flight", "{}"),
    ("params GiB", "params_gib", "{:.3f}"),
    ("grads GiB", "grads_gib", "{:.3f}"),
    ("optim GiB", "optimizer_gib", "{:.3f}"),
    ("activ GiB", "activations_gib", "{:.3f}"),
    ("peak GiB", "peak_gib", "{:.3f}"),
]


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


def format_table(rows: list[dict]) -> str:
    """The planned ranks as an aligned table (numbers right-aligned)."""
    cells = [[fmt.format(row[key]) for _, key, fmt in COLUMNS] for row in rows]
    heads = [head for head, _, _ in COLUMNS]
    widths = [max(len(c) for c in col) for col in zip(heads, *cells, strict=True)]

    def line(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        return "  ".join(
            [first, *(v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True))]
        )

    return "\n".join([line(heads), *(line(c) for c in cells)])


def run(args: argparse.Namespace) -> int:
    """Plan each rank (a progress line on stderr), then print the table; a KilnError propagates
    as the real run's one-liner."""
    from kiln.training.plan.configs import cpu_stand_in, train_configs, world_size_of
    from kiln.training.plan.memory import plan_rank

    configs = [c for spec in args.specs for c in train_configs(spec, args.overrides)]
    ranks = [int(x) for x in args.ranks.split(",")]
    jobs = [(name, cfg, r) for name, cfg in configs for r in ranks]
    rows = []
    for i, (name, cfg, r) in enumerate(jobs, 1):
        world = args.world or world_size_of(cfg)
        print(
            f"planning {name}: rank {r % world} of {world} ({i}/{len(jobs)})",
            file=sys.stderr,
            flush=True,
        )
        rows.append(
            {"name": name, **plan_rank(cpu_stand_in(cfg, shrink=args.shrink), r % world, world)}
        )
    if rows:
        print(format_table(rows), flush=True)
    else:
        print("no train stage to plan", file=sys.stderr)
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
