"""model.fused_projections in the Trainer: the first step's loss and gradients equal the unfused
run's, in one process, under FSDP2 (dp_shard=2), tensor parallelism (tp=2: Qwen2/3-style GQA
with biases and qk-norm, Gemma 3, DeepSeek's dense and shared-expert feed-forwards) and both
(tp=2 x dp_shard=2, 4 ranks), where the state dict, gathered, is one process's unfused one bit
for bit, in its names and order (what exports write); a checkpoint saved fused (model and
optimizer state) resumes unfused in one process, and the reverse, on the same losses, from
dp_shard=2, tp=2 and tp=2 x dp_shard=2."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from kiln.model.fused_projections import fused_modules, split_entries
from kiln.training.trainer import Trainer
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import DEEPSEEK, GEMMA3, STEPS, train_config

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
    names = (
        "layers.0.attention.wq.weight",
        "layers.0.feed_forward.w1.weight",
        "layers.1.shared_experts.w1.weight",  # DeepSeek's shared experts
    )
    return {
        name: str(getattr(state[name], "placements", "plain")) for name in names if name in state
    }


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


# Under tensor parallelism: the shapes whose fused Linears TP splits (MLA attention stays unfused;
# DeepSeek's dense first layer and shared experts fuse w1/w3)
TP_SHAPES = {"qwen": SHAPE, "gemma3": GEMMA3, "deepseek": DEEPSEEK}


def _whole_state(trainer: Trainer) -> list[tuple[str, np.ndarray]]:
    """The model's state dict gathered whole, in its order (what an export writes)."""
    state = trainer.model_parts[0].state_dict()
    whole = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
    return [(k, v.detach().clone().numpy()) for k, v in whole.items()]  # not the live weights


def steps(parallel: dict, shapes: dict, meta_init: bool = True) -> dict:
    """Rank function: per shape, fused and not, the first step's loss, gradients and layout,
    the losses of all STEPS steps and the initial state dict, gathered. `meta_init` False: every
    rank builds the whole model and TP lays out and splits its weights (not meta_init's draw)."""
    out = {}
    for name, shape in shapes.items():
        for fused in (False, True):
            torch.manual_seed(0)
            cfg = train_config(parallel, {**shape, "fused_projections": fused})
            trainer = Trainer(cfg.model_copy(update={"meta_init": meta_init})).setup()
            state = _whole_state(trainer)
            first = trainer.train_step()["loss"]
            grads, placements = _grads(trainer), _placements(trainer)
            later = [trainer.train_step()["loss"] for _ in range(STEPS - 1)]
            out[name, fused] = ((first, grads, placements), [first, *later], state)
    return out


def assert_layouts_equal(runs: dict, single: dict, atol: float) -> None:
    """Fused equals unfused under the same layout (1e-6), and one process (`atol`); the
    initial state dicts, gathered, are one process's unfused one: names, order and bits."""
    for name, fused in runs:
        want = single[name, False][2]
        assert [k for k, _ in runs[name, fused][2]] == [k for k, _ in want], (name, fused)
        for (key, got), (_, ref) in zip(runs[name, fused][2], want, strict=True):
            assert np.array_equal(got, ref), (name, fused, key)
        if fused:
            assert_same(runs[name, True][0], runs[name, False][0])
            np.testing.assert_allclose(runs[name, True][1], runs[name, False][1], atol=1e-6)
            first, want = runs[name, True][0], single[name, False][0]
            assert abs(first[0] - want[0]) <= atol, name
            for param in want[1]:
                got, ref = torch.from_numpy(first[1][param]), torch.from_numpy(want[1][param])
                torch.testing.assert_close(got, ref, atol=atol, rtol=0, msg=f"{name} {param}")
            np.testing.assert_allclose(runs[name, True][1], single[name, False][1], atol=atol)


def tp2_steps() -> dict:
    """Rank function: `steps` under tp=2, built on meta and (the Qwen-style shape) whole."""
    whole = steps({"tp": 2}, {"qwen": SHAPE}, meta_init=False)
    return {**steps({"tp": 2}, TP_SHAPES), **{("qwen-whole", f): v for (_, f), v in whole.items()}}


@pytest.mark.slow
def test_tp2_fused_equals_unfused_and_one_process():
    """tp=2 (2 gloo ranks): each rank holds its own heads' q, k, v and its own gate/up rows, so
    losses and gradients equal the unfused tp=2 run's and one process's over 3 steps; the split
    state dict entries are the unfused layout's row shards (no gather)."""
    single = steps({}, TP_SHAPES)
    single["qwen-whole", False] = steps({}, {"qwen": SHAPE}, meta_init=False)["qwen", False]
    for runs in run_distributed(tp2_steps, 2, timeout=600):
        assert_layouts_equal(runs, single, atol=1e-5)
        assert len(runs) == 2 * (len(TP_SHAPES) + 1)
        for name in TP_SHAPES:
            layouts = runs[name, True][0][2]
            assert set(layouts.values()) == set(runs[name, False][0][2].values()), name
            assert set(layouts.values()) == {"(Replicate(), Shard(dim=0))"}, name


def save_tp(parallel: dict, root: str, plain: str) -> tuple[list[float], list[float]]:
    """Rank function: a fused run saving at SAVE_AT, and a fused run resuming `plain`."""
    saving = {"dir": root, "interval_steps": SAVE_AT, "save_final": False}
    saved = losses(parallel, True, saving)
    return saved, losses(parallel, True, {"load_from": plain})


@pytest.mark.slow
def test_tp2_checkpoints_cross_to_one_process_unfused(tmp_path):
    """A fused tp=2 checkpoint (model and Adam state) resumes unfused in one process, and an
    unfused one-process checkpoint resumes fused under tp=2, on the same losses."""
    root = str(tmp_path / "plain")
    plain = losses({}, False, {"dir": root, "interval_steps": SAVE_AT, "save_final": False})
    plain_ckpt = f"{root}/step-{SAVE_AT:08d}"
    fused_root = str(tmp_path / "fused-tp2")
    per_rank = run_distributed(save_tp, 2, {"tp": 2}, fused_root, plain_ckpt, timeout=600)
    resumed = losses({}, False, {"load_from": f"{fused_root}/step-{SAVE_AT:08d}"})
    for saved, resumed_fused in per_rank:
        np.testing.assert_allclose(saved, plain, rtol=0, atol=1e-5)
        np.testing.assert_allclose(resumed, saved[SAVE_AT:], rtol=0, atol=1e-5)
        np.testing.assert_allclose(resumed_fused, plain[SAVE_AT:], rtol=0, atol=1e-5)


def tp_dp(root: str, plain: str) -> tuple[dict, tuple[list[float], list[float]]]:
    """Rank function under tp=2 x dp_shard=2: the steps of the Qwen-style shape, and save_tp."""
    parallel = {"tp": 2, "dp_shard": 2}
    return steps(parallel, {"qwen": SHAPE}), save_tp(parallel, root, plain)


@pytest.mark.slow
def test_tp2_dp_shard2_fused_equals_one_process_and_checkpoints_cross(tmp_path):
    """tp=2 x dp_shard=2 (4 gloo ranks): fused weights shard by heads over tp and by columns
    over dp (their 1-D biases by FSDP's strided rows, split through the whole tensor); the
    same losses and gradients as unfused and one process, and checkpoints cross both ways."""
    single = steps({}, {"qwen": SHAPE})
    root = str(tmp_path / "plain")
    plain = losses({}, False, {"dir": root, "interval_steps": SAVE_AT, "save_final": False})
    fused_root = str(tmp_path / "fused")
    per_rank = run_distributed(tp_dp, 4, fused_root, f"{root}/step-{SAVE_AT:08d}", timeout=900)
    resumed = losses({}, False, {"load_from": f"{fused_root}/step-{SAVE_AT:08d}"})
    for runs, (saved, resumed_fused) in per_rank:
        assert_layouts_equal(runs, single, atol=1e-5)
        assert set(runs["qwen", True][0][2].values()) == {"(Shard(dim=1), Shard(dim=0))"}
        np.testing.assert_allclose(saved, plain, rtol=0, atol=1e-5)
        np.testing.assert_allclose(resumed, saved[SAVE_AT:], rtol=0, atol=1e-5)
        np.testing.assert_allclose(resumed_fused, plain[SAVE_AT:], rtol=0, atol=1e-5)
