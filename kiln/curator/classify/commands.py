"""The handler of `kiln classify` (imported only when it runs)."""

from __future__ import annotations

from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.run import classify
from kiln.platform import console
from kiln.platform.config import load_config as load
from kiln.platform.signals import stop_on_signals


def classify_command(args) -> int:
    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    cfg = load_config(
        args.config,
        input=args.input,
        high_quality=args.high_quality,
        labelled=args.labelled,
        kind="domain" if args.labelled else None,
        classifier=args.classifier,
        model=args.model,
        cluster=args.cluster,
    )
    with console.command_log(args.output):  # Ray's output (--cluster ray): <out>/logs/
        report = classify(cfg, args.output)
    console.summary(
        [
            ("documents in", report["documents_in"]),
            ("kept", report["kept"]),
            ("rejected", report["rejected"]),
            ("rejected by", console.ranked_counts(report["removed_by_reason"])),
            ("score cutoff", report["cutoff"]),
            ("held-out accuracy", report["model"].get("held_out_accuracy")),
            ("corpus", args.output),
        ]
    )
    return 0


def load_config(path: str | None, **overrides):
    return load(ClassifyConfig, path, fields=overrides, prefix="classify")
