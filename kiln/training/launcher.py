"""`train(cfg)` runs a TrainConfig: in this process when torch.distributed is already up (torchrun,
Ray Train) or when the layout needs one process; otherwise it launches torchrun with as many
processes as the layout needs and returns rank 0's per-step metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.platform.errors import KilnError
from kiln.training.config import TrainConfig
from kiln.training.parallel.dims import ParallelDims
from kiln.training.trainer import Trainer

if TYPE_CHECKING:
    from kiln.training.config import TrainConfig


def train(cfg: TrainConfig | dict, nproc: int | None = None) -> list[dict[str, Any]]:
    """Train; returns the per-step metrics (loss, grad_norm, lr, tokens_per_s, mfu, ...).

    `nproc`: processes to launch (default: the fewest the layout runs on, dp_shard=-1 as 1).
    """
    import torch.distributed as dist

    cfg = TrainConfig.model_validate(cfg) if isinstance(cfg, dict) else cfg
    nproc = ParallelDims.from_config(cfg.parallel, nproc).world_size  # validates the layout
    if (dist.is_available() and dist.is_initialized()) or nproc == 1:
        return Trainer(cfg).train()
    return _launch_torchrun(cfg, nproc)


def _launch_torchrun(cfg: TrainConfig, nproc: int) -> list[dict[str, Any]]:
    """Run under `torch.distributed.run` on this machine; metrics come back through a JSONL file."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kiln-train-") as tmp:
        metrics = cfg.metrics_file or os.path.join(tmp, "metrics.jsonl")
        if os.path.exists(metrics) and not cfg.metrics_file:
            os.remove(metrics)
        start = os.path.getsize(metrics) if os.path.exists(metrics) else 0
        config_path = os.path.join(tmp, "train.json")
        with open(config_path, "w") as f:
            f.write(cfg.model_copy(update={"metrics_file": metrics}).model_dump_json())
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "kiln.training.torchrun_main",
            "--config",
            config_path,
        ]
        result = subprocess.run(cmd, check=False)
        if result.returncode != 0:
            raise KilnError(
                f"training failed under torchrun (exit code {result.returncode}); see the log above"
            )
        with open(metrics) as f:
            f.seek(start)
            return [json.loads(line) for line in f if line.strip()]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
