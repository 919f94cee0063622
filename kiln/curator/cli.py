"""`kiln curate --input PATH... --output DIR [--config FILE] [--set KEY=VALUE ...]`."""

from __future__ import annotations

from kiln.curator.classify import cli as classify_cli
from kiln.curator.generate import cli as generate_cli


def register(subparsers) -> None:
    """The curator's commands: `curate`, then classify's and generate's."""
    _register_curate(subparsers)
    classify_cli.register(subparsers)
    generate_cli.register(subparsers)


def _register_curate(subparsers) -> None:
    p = subparsers.add_parser(
        "curate", help="read, clean, filter and deduplicate text into a Parquet corpus"
    )
    p.add_argument(
        "--input", nargs="+", required=True, metavar="PATH", help="files, folders or globs"
    )
    p.add_argument("--out", "--output", dest="output", required=True, metavar="DIR")
    p.add_argument("--config", metavar="FILE", help="YAML or JSON with CurateConfig fields")
    p.add_argument(
        "--stream", choices=["ray", "inline"], help="override config: where per-document work runs"
    )
    p.add_argument(
        "--cluster", choices=["local", "ray"], help="override config: Dask scheduler for dedup"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set dedup.fuzzy.threshold=0.9 (values are YAML)",
    )
    p.set_defaults(handler="kiln.curator.commands:curate_command")
