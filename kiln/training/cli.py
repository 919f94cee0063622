"""`kiln train --config FILE [--set key.path=value ...]`: one training run on Ray Train."""

from __future__ import annotations

from kiln.training.data import cli as data_cli
from kiln.training.plan import cli as plan_cli
from kiln.training.post import cli as post_cli
from kiln.training.rl import cli as rl_cli
from kiln.training.rl import task_cli as rl_task_cli


def register(subparsers) -> None:
    """Training's commands, in the order of a run: tokenize, train, plan, post-training, RL."""
    data_cli.register(subparsers)
    _register_train(subparsers)
    plan_cli.register(subparsers)
    post_cli.register(subparsers)
    rl_task_cli.register(subparsers)
    rl_cli.register(subparsers)


def _register_train(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model on Ray Train (every parallelism, resumable)"
    )
    p.add_argument(
        "--config", required=True, help="YAML: TrainConfig fields plus an optional `ray:` block"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set steps=100 --set parallel.tp=2 (values are YAML)",
    )
    p.add_argument(
        "--out",
        "--output",
        "--run-dir",
        dest="run_dir",
        default=None,
        help="metrics, TensorBoard, loss curve (default: runs/train/<ray.name>)",
    )
    p.set_defaults(handler="kiln.training.commands:train_command")
