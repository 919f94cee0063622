"""`checkpoint.last_save_model_only`: the save after the last step holds the weights but no
optimizer state (a third of an AdamW checkpoint); earlier saves stay whole, and a longer run
resumes from it at its step with a fresh optimizer."""

from __future__ import annotations

import os

import torch
from torch.distributed.checkpoint import FileSystemReader

from kiln.training.checkpoint import latest_checkpoint, load_model_state, read_sidecar
from kiln.training.config import TrainConfig
from kiln.training.trainer import Trainer


def _config(ckpt_dir: str, steps: int) -> TrainConfig:
    return TrainConfig(
        model="tiny",
        steps=steps,
        seq_len=32,
        global_batch_size=2,
        micro_batch_size=2,
        parallel={"dp_shard": 1},
        data={"synthetic": True},
        checkpoint={"dir": ckpt_dir, "interval_steps": 1, "last_save_model_only": True},
    )


def _keys(step_dir: str) -> set[str]:
    return set(FileSystemReader(step_dir).read_metadata().state_dict_metadata)


def _bytes(step_dir: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(step_dir) if e.is_file())


def test_last_save_holds_no_optimizer_and_a_longer_run_resumes_from_it(tmp_path):
    root = str(tmp_path / "run")
    trainer = Trainer(_config(root, steps=2)).setup()
    trainer.train()
    final = latest_checkpoint(root)
    first = os.path.join(root, "step-00000001")
    assert final.rstrip("/").endswith("step-00000002")
    assert any(k.startswith("optimizer.") for k in _keys(first))  # not the last: whole
    assert not any(k.startswith("optimizer.") for k in _keys(final))
    assert "train.step" in _keys(final) and read_sidecar(final)["model_only"] is True
    assert _bytes(final) < 0.5 * _bytes(first)  # AdamW's two moments per weight are gone
    _, saved = load_model_state(root)
    live = trainer.model_parts[0].state_dict()
    for name, tensor in saved.items():
        torch.testing.assert_close(live[name], tensor, rtol=0, atol=0)

    resumed = Trainer(_config(root, steps=3)).setup()
    assert resumed.step == 2  # resumed, not a fresh run from the weights
    assert not resumed.optimizers[0].state  # no moments to restore: a fresh optimizer
    history = resumed.train()
    assert [h["step"] for h in history] == [3]
    assert resumed.optimizers[0].state  # the step ran with its fresh moments
    assert read_sidecar(latest_checkpoint(root))["step"] == 3
