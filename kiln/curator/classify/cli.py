"""`kiln classify --input PATH... --output DIR [--high-quality PATH...] [--config FILE]`."""

from __future__ import annotations

from kiln.platform import console


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "classify",
        help="train a fastText quality (or domain) classifier, score a corpus, keep the best",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="PATH")
    p.add_argument("--out", "--output", dest="output", required=True, metavar="DIR")
    p.add_argument("--high-quality", nargs="+", metavar="PATH", help="good text to train from")
    p.add_argument("--labelled", metavar="JSONL", help="domain classifier: labelled examples")
    p.add_argument("--model", metavar="DIR", help="a trained classifier folder: skip training")
    p.add_argument("--config", metavar="FILE", help="YAML or JSON with ClassifyConfig fields")
    p.add_argument("--cluster", choices=["local", "ray"], help="score here or on Ray Data")
    p.set_defaults(func=_classify)


def load_config(path: str | None, **overrides):
    from kiln.curator.classify.config import ClassifyConfig
    from kiln.platform.config import load_config as load

    return load(ClassifyConfig, path, fields=overrides, prefix="classify")


def _classify(args) -> int:
    from kiln.curator.classify.run import classify
    from kiln.platform.signals import stop_on_signals

    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    cfg = load_config(
        args.config,
        input=args.input,
        high_quality=args.high_quality,
        labelled=args.labelled,
        kind="domain" if args.labelled else None,
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
