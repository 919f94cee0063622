"""Saved at tp2 x pp2 x dp_shard2 (8 ranks), loaded at dp_shard4 (4 ranks) and in one process:
identical gathered parameters and optimizer state, and the same continued losses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kiln.model.formats.checkpoint import load_state
from kiln.training.checkpoint import load_model_state
from kiln.training.config import TrainConfig
from tests.training.checkpoint.gather import gathered_state
from tests.training.distributed import run_distributed

SAVE_AT, STEPS = 2, 3  # one step continued after the checkpoint


def _config(parallel: dict, **checkpoint) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": "tiny",
            "parallel": parallel,
            "steps": STEPS,
            "seq_len": 32,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "checkpoint": checkpoint,
        }
    )


def _save_and_continue(root: str) -> tuple[dict, list[float]]:
    from kiln.training.trainer import Trainer

    cfg = _config(
        {"tp": 2, "pp": 2, "dp_shard": 2}, dir=root, interval_steps=SAVE_AT, save_final=False
    )
    captured = {}
    trainer = Trainer(
        cfg, on_step=lambda m: m["step"] == SAVE_AT and captured.update(gathered_state(trainer))
    )
    losses = [m["loss"] for m in trainer.train()]
    return captured, losses[SAVE_AT:]


def _load_and_continue(ckpt: str, parallel: dict) -> tuple[dict, list[float], int]:
    from kiln.training.trainer import Trainer

    trainer = Trainer(_config(parallel, load_from=ckpt)).setup()
    state, step = gathered_state(trainer), trainer.step
    return state, [m["loss"] for m in trainer.train()], step


@pytest.mark.slow
def test_reshard_tp2_pp2_dp2_to_dp4_and_one_process(tmp_path):
    root = str(tmp_path / "ckpt")
    saved = run_distributed(_save_and_continue, 8, root)
    saved_state = {
        k: v for state, _ in saved for k, v in state.items()
    }  # pp ranks hold different keys
    continued = saved[0][1]
    ckpt = f"{root}/step-{SAVE_AT:08d}"

    # The one-process load trains in a thread here while the 4 ranks start and sync.
    with ThreadPoolExecutor(1) as pool:
        one_process = pool.submit(_load_and_continue, ckpt, {"dp_shard": 1})
        (state4, losses4, step4), *_ = run_distributed(_load_and_continue, 4, ckpt, {"dp_shard": 4})
        state1, losses1, _ = one_process.result()
    assert step4 == SAVE_AT
    assert state4.keys() == saved_state.keys()
    for k, v in saved_state.items():
        np.testing.assert_array_equal(state4[k], v, err_msg=k)
    np.testing.assert_allclose(losses4, continued, rtol=0, atol=1e-5)

    # One process, no torch.distributed: the checkpoint read back whole, then trained on.
    _, model_sd = load_model_state(ckpt)
    optim = load_state(ckpt, "optimizer")
    offline = {f"model.{k}": v for k, v in model_sd.items()} | {
        f"optimizer.{k}": v for k, v in optim.items()
    }
    for k, v in saved_state.items():
        np.testing.assert_array_equal(offline[k].float().numpy(), v, err_msg=k)
    for k, v in saved_state.items():
        np.testing.assert_array_equal(state1[k], v, err_msg=k)
    np.testing.assert_allclose(losses1, continued, rtol=0, atol=1e-5)
