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
