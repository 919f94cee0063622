"""`kiln curate --input PATH... --output DIR [--config FILE] [--set KEY=VALUE ...]`."""

from __future__ import annotations

from kiln.curator.classify import cli as classify_cli
from kiln.curator.generate import cli as generate_cli
from kiln.platform import console


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
    p.set_defaults(func=_curate)


def load_config(path: str | None, overrides: list[str] = (), **fields):
    """CurateConfig from `path` (its `curate:` block, or the whole file), CLI fields, --set."""
    from kiln.curator.config import CurateConfig
    from kiln.platform.config import load_config as load

    return load(
        CurateConfig, path, block="curate", fields=fields, overrides=overrides, prefix="curate"
    )


def _curate(args) -> int:
    from kiln.curator.pipeline import curate
    from kiln.platform.signals import stop_on_signals

    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    cfg = load_config(
        args.config, args.overrides, input=args.input, stream=args.stream, cluster=args.cluster
    )
    with console.command_log(args.output):  # Ray's and Dask's output: <out>/logs/
        report = curate(cfg, args.output)
    console.summary(
        [
            ("documents in", report["documents_in"]),
            ("kept", report["kept"]),
            ("rejected", report["rejected"]),
            ("rejected by", console.ranked_counts(report["removed_by_reason"])),
            ("docs/s", round(report["docs_per_s"])),
            ("corpus", args.output),
        ]
    )
    return 0
