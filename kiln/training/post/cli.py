"""`kiln prepare-chat`, `kiln prepare-preference`, `kiln sft`, `kiln dpo`."""

from __future__ import annotations

import argparse

from kiln.platform import console


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
        p.set_defaults(func=_prepare, kind=name)

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
        p.set_defaults(func=_train, objective=name)


def _prepare(args) -> int:
    from kiln.platform.errors import ConfigError
    from kiln.training.post.prepare import prepare_chat, prepare_preference

    if not 0 <= args.valid_fraction < 1:
        raise ConfigError(f"--valid-fraction {args.valid_fraction}: expected 0 <= share < 1")
    common = {
        "tokenizer": args.tokenizer,
        "template": args.template,
        "seq_len": args.seq_len,
        "add_tokens": args.add_chat_tokens,
        "valid_fraction": args.valid_fraction,
    }
    if args.kind == "prepare-chat":
        meta = prepare_chat(
            args.inputs, args.out, loss_mask=args.loss_mask, packing=args.packing, **common
        )
    else:
        meta = prepare_preference(args.inputs, args.out, **common)
    counts = meta["counts"]
    console.summary(
        [
            ("rows read", counts["read"]),
            ("rejected", counts["rejected"]),
            ("rejected by", console.ranked_counts(counts["reasons"])),
            ("truncated", meta["truncated"]),
            ("training rows", meta["rows"]),
            ("valid rows", meta["valid_rows"]),
            ("tokens", meta.get("tokens")),
            ("dataset", args.out),
        ]
    )
    return 0


def _train(args) -> int:
    from pathlib import Path

    from kiln.platform.signals import stop_on_signals
    from kiln.training.post.run import load_config, train_post

    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    cfg = load_config(args.config, args.overrides, objective=args.objective)
    # library output to <export>/logs/ (or runs/<objective>/logs/); steps on the progress bar
    with (
        console.command_log(args.export or Path("runs") / args.objective),
        console.Progress(cfg.steps, args.objective, unit="steps") as progress,
    ):

        def on_step(m: dict) -> None:
            progress.update(int(m["step"]), f"loss {m['loss']:.3f}")

        result = train_post(cfg, args.export, on_step=on_step)
    final = result["final"] or {}
    rows = [
        ("steps", result["steps"]),
        ("first loss", result["first_loss"]),
        ("final loss", final.get("loss")),
    ]
    rows += [(k, v) for k, v in final.items() if k.startswith("rewards/")]
    rows.append(("model", str(Path(args.export) / "hf") if args.export else None))
    console.summary(rows)
    return 0
