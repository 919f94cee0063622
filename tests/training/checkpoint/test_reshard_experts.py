"""An MoE saved under expert parallelism (dp_shard 2 x ep 2) holds whole [E, ., .] expert
weights and optimizer state (read back in one process), and resumes to the same losses.

(A Trainer resume at another ep size is not covered: the EP run's optimizer has separate param
groups for its plain expert weights, and the LR scheduler's state counts groups.)"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.model.formats.checkpoint import load_state
from kiln.training.checkpoint import load_model_state
from kiln.training.config import TrainConfig
from kiln.training.trainer import Trainer
from tests.training.checkpoint.gather import gathered_state
from tests.training.distributed import run_distributed

SAVE_AT, STEPS = 2, 3


def _config(parallel: dict, **checkpoint) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"preset": "tiny", "n_layers": 2, "n_experts": 4, "top_k": 2},
            "parallel": parallel,
            "steps": STEPS,
            "seq_len": 32,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "precision": "fp32",
            "checkpoint": checkpoint,
        }
    )


def _save_and_continue(root: str) -> tuple[dict, list[float]]:
    cfg = _config({"dp_shard": 2, "ep": 2}, dir=root, interval_steps=SAVE_AT, save_final=False)
    captured = {}
    trainer = Trainer(
        cfg, on_step=lambda m: m["step"] == SAVE_AT and captured.update(gathered_state(trainer))
    )
    losses = [m["loss"] for m in trainer.train()]
    return captured, losses[SAVE_AT:]


def _load_and_continue(ckpt: str) -> tuple[dict, list[float], int]:
    trainer = Trainer(_config({"dp_shard": 2, "ep": 2}, load_from=ckpt)).setup()
    state, step = gathered_state(trainer), trainer.step
    return state, [m["loss"] for m in trainer.train()], step


@pytest.mark.slow
def test_ep2_checkpoint_holds_whole_experts_and_resumes(tmp_path):
    """~35 s on 2 busy cores: 2 gloo ranks save, one process reads, 2 ranks resume."""
    root = str(tmp_path / "ckpt")
    (saved, continued), (saved1, _) = run_distributed(_save_and_continue, 2, root)
    assert saved.keys() == saved1.keys()
    expert_keys = [k for k in saved if ".experts.w" in k and saved[k].ndim]
    assert len(expert_keys) == 2 * 2 * 3  # 2 layers x (w13, w2) x (weight, exp_avg, exp_avg_sq)
    assert all(saved[k].shape[0] == 4 for k in expert_keys)  # all 4 experts, gathered
    ckpt = f"{root}/step-{SAVE_AT:08d}"

    _, model_sd = load_model_state(ckpt)
    offline = {f"model.{k}": v for k, v in model_sd.items()} | {
        f"optimizer.{k}": v for k, v in load_state(ckpt, "optimizer").items()
    }
    for k in expert_keys:
        np.testing.assert_array_equal(offline[k].float().numpy(), saved[k], err_msg=k)

    (state, losses, step), _ = run_distributed(_load_and_continue, 2, ckpt)
    assert step == SAVE_AT and state.keys() == saved.keys()
    for k, v in saved.items():
        np.testing.assert_array_equal(state[k], v, err_msg=k)
    np.testing.assert_allclose(losses, continued, rtol=0, atol=1e-5)
