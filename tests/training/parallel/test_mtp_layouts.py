"""Multi-token prediction (mtp_depth 2 on the tiny DeepSeek-V3) trains under FSDP (dp_shard=2),
expert parallelism (ep=2) and plain data parallelism (dp_replicate=2) as in one process: the
same loss, grad norm and MTP loss at every step (fp32, gloo); pp, tp and cp are refused by name.
With mtp_loss_weight 0 the main model trains as without MTP."""

from __future__ import annotations

import pytest
import torch

from kiln.platform.errors import ConfigError
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import DEEPSEEK, train_config

MTP = {**DEEPSEEK, "mtp_depth": 2}
LAYOUTS = [
    ("dp2", {"dp_shard": 2}),
    ("ep2", {"dp_shard": 2, "ep": 2}),
    ("replicate2", {"dp_replicate": 2, "dp_shard": 1}),
]


def train_metrics(layouts: list[tuple[dict, dict]]) -> list[list[tuple[float, ...]]]:
    """(loss, grad_norm, mtp_loss or None) per step of one run per (parallel, model) layout."""
    from kiln.training.trainer import Trainer

    results = []
    for parallel, model in layouts:
        torch.manual_seed(0)
        history = Trainer(train_config(parallel, model)).train()
        results.append([(m["loss"], m["grad_norm"], m.get("mtp_loss")) for m in history])
    return results


def test_mtp_trains_under_fsdp_ep_and_replicate_as_in_one_process():
    (single,) = train_metrics([({}, MTP)])
    assert all(mtp is not None and mtp > 0 for _, _, mtp in single)
    per_rank = run_distributed(train_metrics, 2, [(p, MTP) for _, p in LAYOUTS])
    for rank, results in enumerate(per_rank):
        for (name, _), steps in zip(LAYOUTS, results, strict=True):
            for step, (got, want) in enumerate(zip(steps, single, strict=True)):
                assert got == pytest.approx(want, abs=1e-5), (name, rank, step, got, want)


def test_mtp_changes_training_only_through_its_weighted_loss():
    """Weight 0: losses bit-identical to mtp_depth 0 (the main path, its init and the data
    order are untouched) and grad norms to the last bit or so (the norm also sums the modules'
    zero gradients); weight 0.3: the trunk learns from MTP too."""
    plain, silent, weighted = train_metrics(
        [({}, DEEPSEEK), ({}, {**MTP, "mtp_loss_weight": 0.0}), ({}, MTP)]
    )
    assert [s[0] for s in silent] == [s[0] for s in plain]
    assert [s[1] for s in silent] == pytest.approx([s[1] for s in plain], rel=1e-6)
    assert weighted[0][0] == plain[0][0]  # same first forward
    assert weighted[1][0] != plain[1][0]  # the MTP gradient moved the main model


@pytest.mark.parametrize("dim", ["pp", "tp", "cp"])
def test_mtp_with_pp_tp_or_cp_is_refused_by_name(dim):
    model = {**MTP, "mla": None, "rope_scaling": None} if dim == "cp" else MTP
    with pytest.raises(ConfigError, match=rf"model.mtp_depth .* parallel.{dim} > 1"):
        train_config({dim: 2}, {**model, "router_bias_update_rate": 0.0})
    with pytest.raises(ValueError, match="mtp_depth"):  # pydantic: the field, ge=0
        train_config({}, {**MTP, "mtp_depth": -1})


def test_mtp_modules_resume_from_a_checkpoint(tmp_path):
    """The modules' weights (and their routers' biases) are in the checkpoint: a run saved after
    step 2 and resumed takes step 3 with the uninterrupted run's loss and MTP loss."""
    from kiln.training.trainer import Trainer

    (straight,) = train_metrics([({}, MTP)])
    save = {"dir": str(tmp_path), "interval_steps": 2, "save_final": False}
    torch.manual_seed(0)
    Trainer(train_config({}, MTP, checkpoint=save)).train()
    load = {"load_from": str(tmp_path / "step-00000002")}
    resumed = Trainer(train_config({}, MTP, checkpoint=load)).setup()
    assert resumed.step == 2
    (last,) = resumed.train()
    assert (last["loss"], last["mtp_loss"]) == pytest.approx(straight[2][::2], abs=1e-6)


def test_mtp_modules_added_to_a_checkpoint_without_them(tmp_path):
    """init_from a run without MTP: the main weights are the checkpoint's, the modules start
    from the init a fresh run gives them; resuming that run with MTP is refused by name. A
    pipeline's `train` on a model input takes the checkpoint's shape plus `model.mtp_depth`,
    and its layout is checked against the result."""
    from kiln.platform.errors import InputError
    from kiln.training.stages import continue_from_model
    from kiln.training.trainer import Trainer

    torch.manual_seed(0)
    Trainer(train_config({}, DEEPSEEK, checkpoint={"dir": str(tmp_path)})).train()
    step_dir = str(tmp_path / "step-00000003")
    torch.manual_seed(0)
    fresh = Trainer(train_config({}, MTP)).setup().model_parts[0].state_dict()
    torch.manual_seed(0)
    grown = {"init_from": step_dir, "dir": str(tmp_path / "mtp"), "interval_steps": 2}
    added = Trainer(train_config({}, MTP, checkpoint=grown)).setup()
    state = added.model_parts[0].state_dict()
    assert torch.equal(state["mtp.1.eh_proj.weight"], fresh["mtp.1.eh_proj.weight"])
    assert not torch.equal(state["output.weight"], fresh["output.weight"])  # 3 steps trained
    assert added.train()[-1]["mtp_loss"] > 0
    with pytest.raises(InputError, match=r"no multi-token prediction modules .*mtp\.0\."):
        Trainer(train_config({}, MTP, checkpoint={"load_from": step_dir})).setup()

    stage_cfg = train_config({}, {"mtp_depth": 2, "mtp_loss_weight": 0.1})
    continued = continue_from_model(stage_cfg, step_dir)
    assert continued.model.mla is not None and continued.model.mtp_depth == 2
    assert continued.model.mtp_loss_weight == 0.1
    assert continue_from_model(train_config({}, {}), step_dir).model.mtp_depth == 0
    with pytest.raises(ConfigError, match=r"model.mtp_depth .* parallel.tp > 1"):
        continue_from_model(train_config({"tp": 2}, {}), str(tmp_path / "mtp"))  # MTP in it
