"""The handlers of kiln.evaluate.cli's commands (imported only when one runs)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kiln.evaluate.config import EvaluateConfig
from kiln.evaluate.run import evaluate
from kiln.platform.errors import ConfigError, format_validation_error
from kiln.platform.runtime import Runtime


def eval_command(args: argparse.Namespace) -> int:
    fields: dict = {
        "api": args.api,
        "limit": args.limit,
        "num_fewshot": args.num_fewshot,
        "num_concurrent": args.num_concurrent,
        "perplexity": {"split": args.split, "seq_len": args.seq_len},
    }
    if args.tasks is not None:
        fields["tasks"] = [] if args.tasks == ["none"] else args.tasks
    try:
        cfg = EvaluateConfig.model_validate(fields)
    except Exception as e:  # pydantic's ValidationError: one line naming the option
        raise ConfigError(format_validation_error(e, "eval")) from None
    out = Path(args.out or f"runs/eval/{time.strftime('%Y%m%d-%H%M%S')}")
    runtime = Runtime(address=args.address)
    try:
        evaluate(
            cfg,
            out,
            url=args.url,
            model_dir=args.model_dir,
            tokens_dir=args.tokens,
            api_key=args.api_key,
            ensure_ray=runtime.ensure,
        )
    finally:
        runtime.shutdown()
    print(f"results: {out.resolve()}/metrics.json (report.md, lm_eval.log)")
    return 0
