"""`kiln classify --input PATH... --output DIR [--high-quality PATH...] [--config FILE]`."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "classify",
        help="train a quality (or domain) classifier (fastText or sentence embeddings), score a "
        "corpus, keep the best",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="PATH")
    p.add_argument("--out", "--output", dest="output", required=True, metavar="DIR")
    p.add_argument("--high-quality", nargs="+", metavar="PATH", help="good text to train from")
    p.add_argument("--labelled", metavar="JSONL", help="domain classifier: labelled examples")
    p.add_argument(
        "--classifier",
        choices=["fasttext", "embedding"],
        help="fastText over n-grams (default) or a head over MiniLM sentence embeddings",
    )
    p.add_argument("--model", metavar="DIR", help="a trained classifier folder: skip training")
    p.add_argument("--config", metavar="FILE", help="YAML or JSON with ClassifyConfig fields")
    p.add_argument("--cluster", choices=["local", "ray"], help="score here or on Ray Data")
    p.set_defaults(handler="kiln.curator.classify.commands:classify_command")
