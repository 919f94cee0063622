"""One-process checkpoints: fsspec URIs, `latest`, keep-last-N, intervals, weights-only load."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

from kiln.model.formats import storage
from kiln.platform.errors import InputError
from kiln.training.checkpoint import (
    CheckpointConfig,
    latest_checkpoint,
    load_model_state,
    read_sidecar,
)
from tests.training.checkpoint.toy import ToyTrainer


def test_fsspec_uri_roundtrip_latest_and_keep_last():
    root = "memory://kiln-ckpt-test"
    trainer = ToyTrainer(CheckpointConfig(dir=root, interval_steps=2, keep_last=2), steps=7)
    trainer.train(until=7)  # saves at 2, 4, 6 and the final 7; keeps the newest 2
    assert [s for s, _ in storage.step_dirs(root)] == [6, 7]
    assert latest_checkpoint(root) == f"{root}/step-00000007"
    side = read_sidecar(root)
    assert side["step"] == 7 and side["tokens_seen"] == 7 * trainer.global_batch * 16
    assert side["dataloader"]["samples_consumed"] == 7 * trainer.global_batch

    fresh = ToyTrainer(CheckpointConfig(dir=root), steps=7, seed=5)
    assert fresh.checkpointer.load() and fresh.step == 7
    _, sd = load_model_state(root)
    for name, p in fresh.model_parts[0].state_dict().items():
        np.testing.assert_array_equal(sd[name].numpy(), p.numpy())
    fsspec.filesystem("memory").rm("/kiln-ckpt-test", recursive=True)


def test_weights_only_load_and_missing_checkpoint(tmp_path):
    root = str(tmp_path)
    ToyTrainer(CheckpointConfig(dir=root, interval_steps=3), steps=3).train(until=3)
    fresh = ToyTrainer(
        CheckpointConfig(load_from=f"{root}/step-00000003", load_optimizer=False), steps=3, seed=5
    )
    assert fresh.checkpointer.load()
    assert fresh.step == 0 and not fresh.optimizers[0].state  # a new run from these weights
    assert (
        ToyTrainer(CheckpointConfig(dir=str(tmp_path / "empty")), steps=1).checkpointer.load()
        is False
    )
    with pytest.raises(InputError):
        ToyTrainer(CheckpointConfig(load_from=str(tmp_path / "nope")), steps=1).checkpointer.load()


def test_unfinished_folder_is_never_latest(tmp_path):
    root = str(tmp_path)
    ToyTrainer(CheckpointConfig(dir=root, interval_steps=2), steps=2).train(until=2)
    (tmp_path / "step-00000004").mkdir()  # a crash mid-save: shards but no .metadata / kiln.json
    (tmp_path / "step-00000004" / "__0_0.distcp").write_bytes(b"partial")
    assert latest_checkpoint(root).endswith("step-00000002")
    assert load_model_state(root)[1]


def test_weights_only_checkpoint_starts_a_fresh_run(tmp_path):
    import torch.distributed.checkpoint as dcp

    from kiln.model.formats.dcp_io import make_writer

    source = ToyTrainer(CheckpointConfig(), steps=1, seed=3)
    ckpt = tmp_path / "step-00000000"
    ckpt.mkdir()
    dcp.save(
        {"model": source.model_parts[0].state_dict()},
        storage_writer=make_writer(str(ckpt)),
        no_dist=True,
    )
    storage.write_json(str(ckpt / "kiln.json"), {"step": 0, "model": {}})
    fresh = ToyTrainer(CheckpointConfig(load_from=str(ckpt)), steps=1, seed=5)
    assert fresh.checkpointer.load() and fresh.step == 0
    for name, p in fresh.model_parts[0].state_dict().items():
        np.testing.assert_array_equal(p.numpy(), source.model_parts[0].state_dict()[name].numpy())
