"""The handlers of kiln.training.post.cli's commands (imported only when one runs)."""

from __future__ import annotations

from pathlib import Path

from kiln.platform import console
from kiln.platform.errors import ConfigError
from kiln.platform.signals import stop_on_signals
from kiln.training.post.prepare import prepare_chat, prepare_preference
from kiln.training.post.run import load_config, train_post


def prepare_command(args) -> int:
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


def train_command(args) -> int:
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
