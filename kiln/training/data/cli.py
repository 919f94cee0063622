"""`kiln tokenize` (Corpus -> Tokenizer + TokenDataset) and `kiln tokens` (describe a dataset)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize", help="train/load a tokenizer and write Megatron indexed datasets per split"
    )
    p.add_argument("corpus", help="a Corpus directory (Parquet shards with id, text)")
    p.add_argument(
        "--out",
        "--output",
        required=True,
        help="output folder: OUT/tokens (TokenDataset) and OUT/tokenizer",
    )
    p.add_argument(
        "--tokenizer", help="use this tokenizer.json (or folder holding one) instead of training"
    )
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument(
        "--special-token", dest="special_tokens", action="append", default=[], metavar="TOKEN"
    )
    p.add_argument("--eod-token", default="<|endoftext|>")
    p.add_argument("--valid-fraction", type=float, default=0.01)
    p.add_argument("--test-fraction", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch-size", type=int, default=1024, help="documents per Ray Data batch")
    p.add_argument("--num-actors", type=int, default=2, help="tokenizer actors")
    p.add_argument(
        "--address", help="Ray cluster to attach to (default: $RAY_ADDRESS, else an embedded Ray)"
    )
    p.set_defaults(handler="kiln.training.data.commands:tokenize_command")

    p = sub.add_parser(
        "tokens", help="describe an indexed dataset (TokenDataset folder or .bin/.idx prefix)"
    )
    p.add_argument("path")
    p.add_argument("--split", default=None, help="only this split of a TokenDataset")
    p.set_defaults(handler="kiln.training.data.commands:describe_command")
