"""Disk full during a checkpoint save (a real size-limited tmpfs, filled by the test after the
first checkpoint): the save fails cleanly, `latest` keeps naming the previous complete
checkpoint, and the half-written folder is gone so nothing half-written can be loaded."""

from __future__ import annotations

import logging
import os

import pytest

from kiln.training.checkpoint import latest_checkpoint
from kiln.training.config import TrainConfig
from tests.reliability.conftest import fill_disk

CONFIG = {
    "model": "tiny",
    "seq_len": 32,
    "global_batch_size": 2,
    "micro_batch_size": 2,
    "log_every": 100,
    "data": {"synthetic": True},
}


def _trainer(disk, steps: int, async_save: bool, on_step):
    from kiln.training.trainer import Trainer

    checkpoint = {"dir": str(disk / "ckpt"), "interval_steps": 2, "async": async_save}
    cfg = TrainConfig.model_validate({**CONFIG, "steps": steps, "checkpoint": checkpoint})
    return Trainer(cfg, on_step=on_step)


def test_sync_save_on_full_disk_stops_with_one_line_and_keeps_latest(small_disk):
    from kiln.training.checkpoint.checkpointer import CheckpointWriteError

    def fill_after_step_3(m):
        if m["step"] == 3:
            fill_disk(small_disk)

    trainer = _trainer(small_disk, 4, False, fill_after_step_3)
    with pytest.raises(CheckpointWriteError) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message and "no space left on device" in message, message
    assert message.startswith("checkpoint step 4:") and "latest is still" in message
    root = str(small_disk / "ckpt")
    assert latest_checkpoint(root).endswith("step-00000002")
    assert sorted(os.listdir(root)) == ["latest", "step-00000002"]  # no half-written step 4


def test_async_save_on_full_disk_warns_and_training_goes_on(small_disk):
    def fill_at_3_free_at_5(m):
        if m["step"] == 3:
            trainer.checkpointer.wait()  # step 2's background save has landed
            fill_disk(small_disk)
        if m["step"] == 5:
            os.remove(small_disk / "filler")

    trainer = _trainer(small_disk, 6, True, fill_at_3_free_at_5)
    # A handler on the logger itself: an earlier test in this process may have turned off
    # propagation on "kiln" (Ray Train's worker logging), which would starve caplog's root handler.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    ckpt_log = logging.getLogger("kiln.checkpoint")
    ckpt_log.addHandler(handler)
    try:
        history = trainer.train()
    finally:
        ckpt_log.removeHandler(handler)
    assert [m["step"] for m in history] == list(range(1, 7))  # training went on
    (warning,) = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert warning.startswith("checkpoint step 4:") and "no space left on device" in warning
    root = str(small_disk / "ckpt")
    assert latest_checkpoint(root).endswith("step-00000006")  # the disk had room again
    assert "step-00000004" not in os.listdir(root)


def test_curator_output_on_full_disk_fails_clearly_without_artifact(tmp_path):
    import json
    import random

    from kiln.curator.stages import CurateStage
    from kiln.platform.errors import StageFailed
    from kiln.platform.pipeline import Pipeline
    from tests.curator.prose import prose
    from tests.reliability.conftest import tmpfs

    rng = random.Random(0)
    source = tmp_path / "in.jsonl"
    with open(source, "w") as f:  # ~0.5 MB of distinct documents for a 128 KiB disk
        for i in range(500):
            f.write(json.dumps({"id": f"d{i}", "text": prose(rng)}) + "\n")
    with tmpfs(tmp_path / "runs", "128k") as runs:
        stage = CurateStage({"input": [str(source)], "stream": "inline"})
        with pytest.raises(StageFailed) as err:
            Pipeline("cur", [stage], runs_dir=runs).run(shutdown=False)
        message = str(err.value)
        assert "\n" not in message and "No space left on device" in message, message
        assert not list(runs.rglob("artifact.json"))  # no artifact claims a complete corpus
        (run_json,) = runs.rglob("run.json")
        stages = json.loads(run_json.read_text())["stages"]
        assert [s["status"] for s in (stages.values() if isinstance(stages, dict) else stages)] == [
            "failed"
        ]
