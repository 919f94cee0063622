"""`kiln classify --input PATH... --output DIR [--high-quality PATH...] [--config FILE]`."""

from __future__ import annotations

import json


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

    cfg = load_config(
        args.config,
        input=args.input,
        high_quality=args.high_quality,
        labelled=args.labelled,
        kind="domain" if args.labelled else None,
        model=args.model,
        cluster=args.cluster,
    )
    report = classify(cfg, args.output)
    keys = ("documents_in", "kept", "rejected", "removed_by_reason", "cutoff")
    print(json.dumps({k: report[k] for k in keys}, indent=2))
    print(f"held-out accuracy {report['model'].get('held_out_accuracy')}; wrote {args.output}")
    return 0
