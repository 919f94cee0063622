"""Checkpointer mechanics on a small FSDP2 model: async == sync, a rank killed mid-save."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from kiln.model.formats.checkpoint import load_state, read_sidecar
from kiln.model.formats.storage import is_complete
from kiln.training.checkpoint import CheckpointConfig, latest_checkpoint, load_model_state
from tests.training.checkpoint.gather import full_state
from tests.training.checkpoint.toy import ToyTrainer, portable
from tests.training.distributed import run_distributed


def _load_and_continue(root: str, tp: int, dp: int) -> tuple[dict, list[float], int]:
    trainer = ToyTrainer(
        CheckpointConfig(dir=root, save_final=False), tp=tp, dp_shard=dp, steps=7, seed=99
    )
    assert trainer.checkpointer.load()
    state = portable(full_state(trainer))
    return state, trainer.train(until=7), trainer.step


def _async_then_sync(root_async: str, root_sync: str) -> None:
    # Training goes on (steps 4, 5) while the step-3 checkpoint is written in the background.
    ToyTrainer(
        CheckpointConfig(dir=root_async, interval_steps=3, **{"async": True}),
        tp=1,
        dp_shard=2,
        steps=5,
    ).train(5)
    ToyTrainer(CheckpointConfig(dir=root_sync, interval_steps=3), tp=1, dp_shard=2, steps=5).train(
        5
    )


@pytest.mark.slow
def test_async_and_sync_saves_load_identical(tmp_path):
    a, s = str(tmp_path / "async"), str(tmp_path / "sync")
    run_distributed(_async_then_sync, 2, a, s)
    for step in ("step-00000003", "step-00000005"):
        sa, ss = load_state(f"{a}/{step}"), load_state(f"{s}/{step}")
        flat_a, flat_s = _flatten(sa), _flatten(ss)
        assert flat_a.keys() == flat_s.keys()
        for k in flat_a:
            if isinstance(flat_a[k], torch.Tensor):
                torch.testing.assert_close(flat_a[k], flat_s[k], rtol=0, atol=0, msg=k)
            elif not k.startswith("rng."):
                assert flat_a[k] == flat_s[k], k
        assert read_sidecar(f"{a}/{step}")["step"] == int(step[5:])
    assert latest_checkpoint(a).endswith("step-00000005")


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _die_while_writing_step_6(root: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter

    trainer = ToyTrainer(CheckpointConfig(dir=root, interval_steps=3), tp=1, dp_shard=2, steps=9)
    trainer.train(until=5)
    if dist.get_rank() == 1:
        original = FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            original(self, plan, planner).wait()  # this rank's shard is on disk ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... and the worker dies before the commit

        FileSystemWriter.write_data = write_then_die
    trainer.train(until=9)


@pytest.mark.slow
def test_worker_killed_mid_save_keeps_previous_latest(tmp_path):
    root = str(tmp_path / "ckpt")
    with pytest.raises(RuntimeError):
        run_distributed(_die_while_writing_step_6, 2, root, timeout=60)
    assert latest_checkpoint(root).endswith("step-00000003")
    # The survivor removes the half-written folder when its save fails; if it died first, the
    # folder stays but is incomplete and ignored.
    half = f"{root}/step-00000006"
    assert not os.path.isdir(half) or not is_complete(half)
    _, sd = load_model_state(root)
    assert sd
    (_, _, step), *_ = run_distributed(_load_and_continue, 2, root, 1, 2)
    assert step == 7
