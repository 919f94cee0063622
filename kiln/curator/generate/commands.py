"""The handler of `kiln generate-batch` (imported only when it runs): the config (--config,
flags, --set), the run, a summary."""

from __future__ import annotations

from kiln.curator.generate.config import GenerateConfig
from kiln.curator.generate.run import generate
from kiln.platform import console
from kiln.platform.config import load_config
from kiln.platform.signals import stop_on_signals


def generate_batch_command(args) -> int:
    stop_on_signals()  # SIGINT/SIGTERM: exit 130/143, an embedded Ray shut down
    fields = {"input": args.input, "model": args.model, "prompt": args.prompt}
    fields["stream"] = args.stream
    cfg = load_config(
        GenerateConfig,
        args.config,
        block="generate",
        fields=fields,
        overrides=args.overrides,
        prefix="generate",
    )
    with console.command_log(args.output):  # Ray's output: <out>/logs/
        report = generate(cfg, args.output)
    console.summary(
        [
            ("rows in", report["documents_in"]),
            ("generated", report["kept"]),
            ("failed", report["rejected"]),
            ("failed by", console.ranked_counts(report["removed_by_reason"])),
            (
                "batches run / resumed",
                f"{report['batches']['processed']} / {report['batches']['resumed']}",
            ),
            ("rows/s", round(report["rows_per_s"], 2)),
            ("tokens/s", round(report["tokens_per_s"], 1)),
            ("corpus", args.output),
        ]
    )
    return 0
