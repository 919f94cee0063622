"""`kiln plan` and `python -m kiln.training.plan`: plan each rank, print the table."""

from __future__ import annotations

import argparse
import sys

from kiln.platform.errors import KilnError
from kiln.training.plan.cli import add_arguments
from kiln.training.plan.configs import cpu_stand_in, train_configs, world_size_of
from kiln.training.plan.memory import plan_rank

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


def plan_command(args: argparse.Namespace) -> int:
    """Plan each rank (a progress line on stderr), then print the table; a KilnError propagates
    as the real run's one-liner."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.training.plan")
    add_arguments(parser)
    try:
        return plan_command(parser.parse_args(argv))
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2
