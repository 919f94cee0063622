"""Loading a checkpoint never unpickles: the RNG and data-loader state are JSON bytes, DCP's
`.metadata` is read by an unpickler that resolves only DCP's own classes, tensors are read with
`torch.load(weights_only=True)`, and so is every non-tensor item (torch's planner would use
`weights_only=False`). A resumed run continues exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
import pickle
import random
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from kiln.model.formats.dcp_io import make_reader
from kiln.model.formats.safe_reader import SafeLoadPlanner
from kiln.platform.errors import InputError
from kiln.training.checkpoint import CheckpointConfig
from kiln.training.checkpoint.json_state import encode_rng, restore_rng
from tests.training.checkpoint.toy import ToyTrainer


def _no_plain_pickle(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("plain pickle.load/loads called while loading a checkpoint")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)


def test_training_state_is_json_and_resume_never_unpickles(tmp_path, monkeypatch):
    root = str(tmp_path)
    straight = ToyTrainer(CheckpointConfig(), steps=4).train(until=4)
    saver = ToyTrainer(CheckpointConfig(dir=root, interval_steps=2), steps=4)
    saver.train(until=2)
    ckpt = os.path.join(root, "step-00000002")

    state = {"rng": {"rank0": b""}, "dataloader": {"dp0": b""}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process without a process group: intended
        dcp.load(state, storage_reader=make_reader(ckpt), planner=SafeLoadPlanner())
    rng = json.loads(state["rng"]["rank0"])
    assert set(rng) == {"python", "numpy", "torch", "cuda"}
    loader = json.loads(state["dataloader"]["dp0"])
    assert loader["samples_consumed"] == 2 * saver.global_batch

    _no_plain_pickle(monkeypatch)
    resumed = ToyTrainer(CheckpointConfig(dir=root), steps=4, seed=5)
    assert resumed.checkpointer.load() and resumed.step == 2
    assert resumed.train(until=4) == pytest.approx(straight[2:], abs=0)


def test_rng_state_roundtrips_through_json():
    blob = encode_rng()
    first = (random.random(), np.random.rand(), torch.rand(3).tolist())
    random.random(), np.random.rand(), torch.rand(5)  # move every generator on
    restore_rng(blob)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist()) == first


class _Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


def test_metadata_that_would_run_code_is_refused(tmp_path):
    root = str(tmp_path)
    ToyTrainer(CheckpointConfig(dir=root, interval_steps=1), steps=1).train(until=1)
    ckpt = os.path.join(root, "step-00000001")
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(_Exploit(), f)
    with pytest.raises(InputError, match="refusing to load") as err:
        ToyTrainer(CheckpointConfig(dir=root), steps=1).checkpointer.load()
    assert "\n" not in str(err.value)
