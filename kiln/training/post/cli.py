"""`kiln prepare-chat`, `kiln prepare-preference`, `kiln sft`, `kiln dpo`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    for name, helptext in (
        ("prepare-chat", "chat/instruction JSONL or Parquet -> packed tokens + loss masks"),
        ("prepare-preference", "preference pairs (prompt, chosen, rejected) -> tokens + masks"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("inputs", help="a .jsonl/.parquet file or a directory of them")
        p.add_argument("--out", "--output", required=True, help="output folder (a chat dataset)")
        p.add_argument("--tokenizer", required=True, help="tokenizer.json or a folder holding one")
        p.add_argument(
            "--template",
            default="chatml",
            help="chatml, or a HF model/tokenizer folder whose chat_template to use",
        )
        p.add_argument("--seq-len", type=int, required=True)
        p.add_argument(
            "--add-chat-tokens",
            action="store_true",
            help="add the template's control tokens (ChatML's) to a kiln-trained tokenizer",
        )
        p.add_argument(
            "--valid-fraction",
            type=float,
            default=0.0,
            help="share of the rows held out as the `valid` split (for eval_interval)",
        )
        if name == "prepare-chat":
            p.add_argument("--loss-mask", choices=["assistant", "last", "all"], default="assistant")
            p.add_argument("--no-packing", dest="packing", action="store_false")
        p.set_defaults(handler="kiln.training.post.commands:prepare_command", kind=name)

    for name in ("sft", "dpo"):
        p = sub.add_parser(
            name, help=f"{name.upper()} (full or LoRA) on the trainer, then export (HF + adapter)"
        )
        p.add_argument("--config", required=True, help="YAML: PostTrainConfig fields")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument(
            "--out",
            "--output",
            "--export",
            dest="export",
            default=None,
            help="write the merged HF (+ PEFT adapter) here",
        )
        p.set_defaults(handler="kiln.training.post.commands:train_command", objective=name)
