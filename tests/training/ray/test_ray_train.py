"""The train stage on Ray Train: a worker killed mid-run, the group restarts, losses match."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from kiln.platform.pipeline import Pipeline
from kiln.training.checkpoint import latest_checkpoint, read_sidecar
from kiln.training.config import TrainConfig
from kiln.training.ray_train import read_metrics
from kiln.training.stages import TrainStage
from tests.training.distributed import run_distributed

STEPS, KILL_AT = 8, 5  # checkpoints at 3 and 6: the kill after step 5 resumes from 3
CONFIG = {
    "model": "tiny",
    "parallel": {"pp": 2, "dp_shard": 1},  # two workers: rank 1 holds the second stage
    "steps": STEPS,
    "seq_len": 32,
    "global_batch_size": 4,
    "micro_batch_size": 2,
    "log_every": 2,
    "data": {"synthetic": True},
    "checkpoint": {"interval_steps": 3},
}


def _uninterrupted() -> list[float]:
    from kiln.training.trainer import Trainer

    return [m["loss"] for m in Trainer(TrainConfig.model_validate(CONFIG)).train()]


@pytest.mark.slow
def test_worker_killed_at_step_5_resumes_with_identical_losses(ray_session, tmp_path, monkeypatch):
    """A pipeline with the train stage: Ray Train, one worker SIGKILLed, one restart."""
    # Ray Train's controller polls its workers every 2 s: it learns of the dead worker, and takes
    # each checkpoint report, on that poll. Ray Train passes this to the controller it starts.
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    ray_options = {
        "max_failures": 1,
        "cpus_per_worker": 0.5,
        "callbacks": ["tests.training.ray.faults:kill_rank1_once_at_step_5"],
    }
    stage = TrainStage({**CONFIG, "ray": ray_options})
    # The uninterrupted reference runs meanwhile: Ray's start and restart are mostly waiting.
    with ThreadPoolExecutor(1) as pool:
        reference_run = pool.submit(run_distributed, _uninterrupted, 2, timeout=900)
        result = Pipeline("fault", [stage], runs_dir=tmp_path).run()
        reference = reference_run.result()[0]

    stage_dir = str(result.run_dir / "train")
    assert os.path.exists(os.path.join(stage_dir, f"killed-at-step-{KILL_AT}"))  # the kill happened
    history = read_metrics(stage_dir)  # steps 4.. come from the attempt after the restart
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    with open(os.path.join(stage_dir, "metrics.jsonl")) as f:
        steps_run = [json.loads(line)["step"] for line in f]
    assert steps_run.count(4) == 2  # resumed from step 3 (step 5 may or may not have logged)
    assert steps_run.count(6) == 1 and steps_run[-1] == STEPS
    for h in history[3:]:
        expected = reference[h["step"] - 1]
        assert abs(h["loss"] - expected) < 1e-6, (h["step"], h["loss"], expected)

    ckpt = result.artifact("train.checkpoint")
    assert ckpt.kind == "Checkpoint" and ckpt.counts["steps"] == STEPS
    assert latest_checkpoint(ckpt.path) == ckpt.meta["latest"]
    assert (
        ckpt.meta["latest"].endswith(f"step-{STEPS:08d}")
        and read_sidecar(ckpt.path)["step"] == STEPS
    )
    assert os.path.getsize(os.path.join(stage_dir, "loss.png")) > 0
    tensorboard = os.listdir(os.path.join(stage_dir, "tensorboard"))
    assert any(f.startswith("events.out.tfevents") for f in tensorboard)
