"""`kiln rl-task arithmetic --out DIR`: write a generated verifiable task's train and held-out
prompt files (JSONL, ready for the `grpo` stage's prompts)."""

from __future__ import annotations

from kiln.training.rl.tasks.arithmetic import ArithmeticConfig


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
    a.set_defaults(handler="kiln.training.rl.commands:arithmetic_command")
