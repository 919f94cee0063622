"""The handlers of kiln.curator.cli's commands (imported only when one runs)."""

from __future__ import annotations

from kiln.curator.config import CurateConfig
from kiln.curator.pipeline import curate
from kiln.platform import console
from kiln.platform.config import load_config as load
from kiln.platform.signals import stop_on_signals


def load_config(path: str | None, overrides: list[str] = (), **fields):
    """CurateConfig from `path` (its `curate:` block, or the whole file), CLI fields, --set."""

    return load(
        CurateConfig, path, block="curate", fields=fields, overrides=overrides, prefix="curate"
    )


def curate_command(args) -> int:
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
