"""`kiln generate-batch --input PATH... --model M --out DIR [--prompt T] [--config F]`."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate-batch",  # `kiln generate` completes one prompt with a running endpoint
        help="batch inference / synthetic data over rows: the `generate` stage's command",
    )
    p.add_argument("--input", nargs="+", metavar="PATH", help="JSONL or Parquet rows")
    p.add_argument("--model", metavar="PATH", help="Kiln checkpoint, HF folder, .gguf, package")
    p.add_argument("--out", "--output", dest="output", required=True, metavar="DIR")
    p.add_argument("--prompt", metavar="TEMPLATE", help="Jinja template over the row's fields")
    p.add_argument("--config", metavar="FILE", help="YAML or JSON with GenerateConfig fields")
    p.add_argument("--stream", choices=["ray", "inline"], help="Ray Data actors or one engine")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set sampling.max_new_tokens=128 (values are YAML)",
    )
    p.set_defaults(handler="kiln.curator.generate.commands:generate_batch_command")
