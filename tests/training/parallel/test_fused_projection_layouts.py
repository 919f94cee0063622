"""model.fused_projections in the Trainer: the first step's loss and gradients equal the unfused
run's, in one process and under FSDP2 (dp_shard=2); a checkpoint saved fused under dp_shard=2
(model and optimizer state) resumes unfused in one process, and the reverse, on the same losses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from kiln.model.fused_projections import fused_modules, split_entries
from kiln.training.trainer import Trainer
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import STEPS, train_config

SHAPE = {"qkv_bias": True, "qk_norm": True}  # Qwen-style: GQA, q/k/v biases, qk-norm
SAVE_AT = 2


def _grads(trainer: Trainer) -> dict[str, np.ndarray]:
    """Every full gradient under its unfused name (numpy: pickled by value between processes)."""
    model = trainer.model_parts[0]
    grads = {
        name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
        for name, p in model.named_parameters()
    }
    for name, module in fused_modules(model).items():
        split_entries(grads, module.fusion, [f"{name}.{{}}.weight", f"{name}.{{}}.bias"])
    return {name: g.detach().numpy() for name, g in grads.items()}


def _placements(trainer: Trainer) -> dict[str, str]:
    """How the state dict's split q and gate weights are laid out (DTensor placements)."""
    state = trainer.model_parts[0].state_dict()
    names = ("layers.0.attention.wq.weight", "layers.0.feed_forward.w1.weight")
    return {name: str(getattr(state[name], "placements", "plain")) for name in names}


def first_step(parallel: dict) -> dict[bool, tuple[float, dict[str, np.ndarray], dict]]:
    out = {}
    for fused in (False, True):
        torch.manual_seed(0)
        trainer = Trainer(train_config(parallel, {**SHAPE, "fused_projections": fused})).setup()
        loss = trainer.train_step()["loss"]
        out[fused] = (loss, _grads(trainer), _placements(trainer))
    return out


def assert_same(a, b) -> None:
    assert abs(a[0] - b[0]) <= 1e-6
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        got, want = torch.from_numpy(a[1][name]), torch.from_numpy(b[1][name])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=name)


def test_one_process_fused_equals_unfused():
    runs = first_step({})
    assert_same(runs[True], runs[False])


def losses(parallel: dict, fused: bool, checkpoint: dict) -> list[float]:
    torch.manual_seed(0)
    cfg = train_config(parallel, {**SHAPE, "fused_projections": fused}, checkpoint=checkpoint)
    return [m["loss"] for m in Trainer(cfg).train()]


def save_fused(root: str) -> tuple[dict, list[float]]:
    """Rank function: the first step, fused and not, then a fused run saving at step SAVE_AT."""
    saving = {"dir": root, "interval_steps": SAVE_AT, "save_final": False}
    return first_step({"dp_shard": 2}), losses({"dp_shard": 2}, True, saving)


@pytest.mark.slow
def test_dp_shard2_fused_equals_unfused_and_checkpoints_cross(tmp_path):
    """Under FSDP2 (2 gloo ranks; ~40 s on 2 busy cores): the same first step, and its fused
    checkpoint resumed unfused in one process; an unfused one resumed fused."""
    single = first_step({})
    root = str(tmp_path / "fused")
    per_rank = run_distributed(save_fused, 2, root, timeout=600)
    for runs, _ in per_rank:
        assert_same(runs[True], runs[False])
        assert_same(runs[True], single[False])
        # fused weights shard by columns, so their split parts stay shards (no gather)
        assert set(runs[True][2].values()) == {"(Shard(dim=1),)"}
        assert set(runs[False][2].values()) == {"(Shard(dim=0),)"}
    fused_losses = per_rank[0][1]
    resumed = losses({}, False, {"load_from": f"{root}/step-{SAVE_AT:08d}"})
    assert len(resumed) == STEPS - SAVE_AT
    np.testing.assert_allclose(resumed, fused_losses[SAVE_AT:], rtol=0, atol=1e-6)

    root = str(tmp_path / "plain")
    plain = losses({}, False, {"dir": root, "interval_steps": SAVE_AT, "save_final": False})
    resumed = losses({}, True, {"load_from": f"{root}/step-{SAVE_AT:08d}"})
    np.testing.assert_allclose(resumed, plain[SAVE_AT:], rtol=0, atol=1e-6)
