"""The handlers of kiln.training.cli's commands (imported only when one runs)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kiln.platform import console
from kiln.platform.config import load_config as load
from kiln.platform.runtime import Runtime
from kiln.platform.signals import stop_on_signals
from kiln.training.metrics_log import METRICS_FILE
from kiln.training.ray_train import train_on_ray
from kiln.training.stages import TrainStageConfig


def load_config(path: str, overrides: list[str]):
    """TrainStageConfig from `path` (its `train:` block, or the whole file) and --set overrides."""

    return load(TrainStageConfig, path, block="train", overrides=overrides, prefix="train")


def train_command(args: argparse.Namespace) -> int:
    stop_on_signals()  # SIGINT/SIGTERM: interrupt the run, shut an embedded Ray down
    cfg = load_config(args.config, args.overrides)
    run_dir = args.run_dir or str(Path("runs") / "train" / cfg.ray.name)
    train_cfg = cfg.train_config()
    # the workers run in Ray Train's own folders: relative data paths are this folder's
    paths = [os.path.abspath(p) if os.path.exists(p) else p for p in train_cfg.data.paths]
    train_cfg = train_cfg.model_copy(
        update={"data": train_cfg.data.model_copy(update={"paths": paths})}
    )
    runtime = Runtime()
    # Ray's and the workers' output: <run_dir>/logs/; progress read from the metrics JSONL
    with (
        console.command_log(run_dir),
        console.follow_metrics(str(Path(run_dir) / METRICS_FILE), train_cfg.steps, "train"),
    ):
        try:
            summary = train_on_ray(train_cfg, run_dir=run_dir, options=cfg.ray, runtime=runtime)
        finally:
            runtime.shutdown()  # only a Ray started here
    final = summary["final"] or {}
    console.summary(
        [
            ("steps", final.get("step")),
            ("final loss", final.get("loss")),
            ("tokens seen", final.get("tokens_seen")),
            ("workers", summary["world_size"]),
            ("checkpoint", summary["checkpoint"]),
            ("metrics", summary["metrics_file"]),
            ("loss curve", summary["loss_curve"]),
        ]
    )
    return 0
