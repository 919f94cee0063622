"""The train loop on Ray Train: a worker killed mid-run, the group restarts, losses match."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from kiln.training.checkpoint import latest_checkpoint, read_sidecar
from kiln.training.config import TrainConfig
from kiln.training.ray_train import read_metrics
from tests.training.distributed import run_distributed

STEPS = 20


def _config(ckpt_dir: str | None) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": "tiny",
            "parallel": {"tp": 2, "pp": 2, "dp_shard": 1},
            "steps": STEPS,
            "seq_len": 32,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "log_every": 5,
            "checkpoint": {"dir": ckpt_dir, "interval_steps": 5},
        }
    )


def _uninterrupted() -> list[float]:
    from kiln.training.trainer import Trainer

    return [m["loss"] for m in Trainer(_config(None)).train()]


@pytest.mark.slow
def test_worker_killed_at_step_12_resumes_with_identical_losses(ray_session, tmp_path):
    """Through `kiln train`: the YAML config, --set overrides, Ray Train, one restart."""
    from kiln.platform.cli import main

    run_dir, ckpt = str(tmp_path / "run"), str(tmp_path / "ckpt")
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump({"train": _config(ckpt).model_dump(mode="json", by_alias=True)})
    )
    hook = "tests.training.ray.faults:kill_rank1_once_at_step_12"
    argv = [
        "train",
        "--config",
        str(config),
        "--run-dir",
        run_dir,
        "--set",
        "ray.name=fault",
        "--set",
        "ray.max_failures=1",
        "--set",
        "ray.cpus_per_worker=0.5",
        "--set",
        f"ray.callbacks=[{hook}]",
    ]
    # The uninterrupted reference runs meanwhile: Ray's start and restart are mostly waiting.
    with ThreadPoolExecutor(1) as pool:
        reference_run = pool.submit(run_distributed, _uninterrupted, 4, timeout=900)
        assert main(argv) == 0
        reference = reference_run.result()[0]

    assert os.path.exists(os.path.join(run_dir, "killed-at-step-12"))  # the kill happened
    history = read_metrics(run_dir)  # steps 11.. come from the attempt after the restart
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        restarted = [json.loads(line)["step"] for line in f]
    assert restarted.count(11) == 2 and restarted.count(13) == 1  # resumed from step 10

    for h in history[10:]:
        assert abs(h["loss"] - reference[h["step"] - 1]) < 1e-6, (
            h["step"],
            h["loss"],
            reference[h["step"] - 1],
        )

    assert read_sidecar(ckpt)["step"] == STEPS and latest_checkpoint(ckpt).endswith(
        f"step-{STEPS:08d}"
    )
    assert os.path.getsize(os.path.join(run_dir, "loss.png")) > 0
    tensorboard = os.listdir(os.path.join(run_dir, "tensorboard"))
    assert any(f.startswith("events.out.tfevents") for f in tensorboard)
