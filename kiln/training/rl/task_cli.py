"""`kiln rl-task arithmetic --out DIR`: write a generated verifiable task's train and held-out
prompt files (JSONL, ready for the `grpo` stage's prompts)."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from kiln.platform import console
from kiln.platform.errors import ConfigError, format_validation_error
from kiln.training.rl.tasks.arithmetic import ArithmeticConfig, write_splits


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "rl-task", help="write a small verifiable RL task (train and held-out prompts)"
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    a = tasks.add_parser("arithmetic", help="integer + - * problems; the answer is 'Answer: N'")
    defaults = ArithmeticConfig()
    a.add_argument("--out", required=True, help="folder for train.jsonl and held_out.jsonl")
    a.add_argument("--seed", type=int, default=defaults.seed)
    a.add_argument("--digits", type=int, default=defaults.digits, help="operands' max digits")
    a.add_argument("--terms", type=int, default=defaults.terms, help="operands per problem")
    a.add_argument(
        "--operations",
        default="".join(defaults.operations),
        help="which of + - * to use, e.g. '+-' (default: %(default)s)",
    )
    a.add_argument("--train", type=int, default=defaults.train, help="training problems")
    a.add_argument("--held-out", type=int, default=defaults.held_out, help="held-out problems")
    a.set_defaults(func=_arithmetic)


def _arithmetic(args: argparse.Namespace) -> int:
    fields = {
        "seed": args.seed,
        "digits": args.digits,
        "terms": args.terms,
        "operations": list(args.operations),
        "train": args.train,
        "held_out": args.held_out,
    }
    try:
        cfg = ArithmeticConfig.model_validate(fields)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix="rl-task arithmetic")) from None
    paths = write_splits(cfg, args.out)
    console.summary(
        [
            ("train", f"{cfg.train} prompts  {paths['train']}"),
            ("held_out", f"{cfg.held_out} prompts  {paths['held_out']}"),
        ]
    )
    return 0
