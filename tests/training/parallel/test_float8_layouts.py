"""precision fp8 on torchao's Float8Linear in kiln's Trainer (CPU: torch's oneDNN _scaled_mm):
the first steps stay near bf16's in one process, and under tp=2 (the TP plan shards the Float8
Linears into DTensors, tensorwise and rowwise), dp_shard=2 (FSDP2, with and without fp8
all-gather), pp=2 and cp=2 the first two steps' losses and every first-step gradient stay within
fp8's error of one process's bf16 step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from kiln.training.trainer import Trainer
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import train_config

# ||grad_fp8 - grad_bf16|| / ||grad_bf16|| per parameter: one process's fp8 step measures 0.10 at
# worst (2 layers of 64-wide GEMMs, e4m3 forward, e5m2 gradients), the layouts 0.08-0.11. A
# sharding mistake (a gradient summed twice, a shard left out) is an error of 0.5 or more.
GRAD_TOLERANCE = 0.2
LOSS_TOLERANCE = 1e-3  # nats; first-step fp8 losses measure within 1e-4 of bf16's
LAYOUTS = [
    ({"tp": 2}, "tensorwise", False),
    ({"tp": 2}, "rowwise", False),
    ({"dp_shard": 2}, "tensorwise", False),
    ({"dp_shard": 2}, "tensorwise", True),  # fp8_all_gather
    ({"pp": 2}, "tensorwise", False),
    ({"cp": 2}, "tensorwise", False),  # ring attention: each rank's GEMMs see half the sequence
]


def fp8_config(
    parallel: dict, precision: str = "fp8", recipe: str | None = None, all_gather: bool = False
):
    return train_config(parallel, {}).model_copy(
        update={"precision": precision, "fp8_recipe": recipe, "fp8_all_gather": all_gather}
    )


def first_step(
    parallel: dict, precision: str, recipe: str | None = None, all_gather: bool = False
) -> dict:
    """The first step's loss (None off the last pipeline stage), this rank's full gradients, how
    its Float8Linear weights are laid out, and the next step's loss."""
    torch.manual_seed(0)
    trainer = Trainer(fp8_config(parallel, precision, recipe, all_gather)).setup()
    loss = trainer.train_step()["loss"]
    grads, float8 = {}, {}
    for part in trainer.model_parts:
        for name, module in part.named_modules():
            if type(module).__name__ == "Float8Linear":
                w = module.weight
                local = type(w.to_local()).__name__ if isinstance(w, DTensor) else ""
                float8[name] = (str(w.placements) if isinstance(w, DTensor) else "plain", local)
        for name, p in part.named_parameters():
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grads[name] = g.detach().float().numpy()
    next_loss = trainer.train_step()["loss"]
    if not trainer.has_last:  # off the last pipeline stage there is no loss to report
        loss = next_loss = None
    return {"loss": loss, "grads": grads, "float8": float8, "next_loss": next_loss}


def every_layout() -> list[dict]:
    """Rank function: two steps per layout (they share one process group)."""
    return [first_step(p, "fp8", recipe, gather) for p, recipe, gather in LAYOUTS]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def assert_near_bf16(run: dict, bf16: dict, what: str) -> None:
    assert abs(run["loss"] - bf16["loss"]) < LOSS_TOLERANCE, what
    assert run["grads"].keys() == bf16["grads"].keys(), what
    for name, grad in run["grads"].items():
        err = relative_error(grad, bf16["grads"][name])
        assert err < GRAD_TOLERANCE, (what, name, err)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_one_process_fp8_steps_stay_near_bf16(recipe):
    from kiln.training.config import FP8_RECIPES

    assert recipe in FP8_RECIPES["torchao"]
    fp8 = first_step({}, "fp8", recipe)
    bf16 = first_step({}, "bf16")
    # every attention and FFN projection of both blocks runs in fp8, the head does not
    assert len(fp8["float8"]) == 2 * 7 and "output" not in fp8["float8"]
    assert_near_bf16(fp8, bf16, recipe)
    # the step after the first optimizer update too
    assert abs(fp8["next_loss"] - bf16["next_loss"]) < LOSS_TOLERANCE
    # fp8 did round: not bf16's gradients to the last bit
    assert max(relative_error(fp8["grads"][n], g) for n, g in bf16["grads"].items()) > 0.01


@pytest.mark.slow
def test_fp8_under_tp_fsdp_and_pp_stays_near_one_process_bf16():
    """2 gloo ranks, six layouts in one group (~35 s on 2 busy cores)."""
    bf16 = first_step({}, "bf16")
    ranks = run_distributed(every_layout, 2)
    merged = []
    for i, (parallel, recipe, all_gather) in enumerate(LAYOUTS):
        what = f"{parallel} {recipe} all_gather={all_gather}"
        per_rank = [r[i] for r in ranks]
        run = {
            "loss": next(r["loss"] for r in per_rank if r["loss"] is not None),
            "next_loss": next(r["next_loss"] for r in per_rank if r["loss"] is not None),
            "grads": {k: v for r in per_rank for k, v in r["grads"].items()},
            "float8": {k: v for r in per_rank for k, v in r["float8"].items()},
        }
        merged.append(run)
        assert_near_bf16(run, bf16, what)
        assert abs(run["next_loss"] - bf16["next_loss"]) < LOSS_TOLERANCE, what
        assert len(run["float8"]) == 2 * 7, what
        if "tp" in parallel:  # the TP plan sharded them: wq/w1 by rows, wo/w2 by columns
            assert run["float8"]["layers.0.attention.wq"][0].endswith("Shard(dim=0))"), what
            assert run["float8"]["layers.0.feed_forward.w2"][0].endswith("Shard(dim=1))"), what
        # FSDP2 holds fp8-casting weights only under fp8_all_gather
        fp8_weights = {local for _, local in run["float8"].values()}
        want = {"WeightWithDynamicFloat8CastTensor"} if all_gather else {"Tensor", ""}
        assert fp8_weights <= want and fp8_weights, (what, fp8_weights)
    # fp8 all-gather quantises the same weights (from the fp32 shards instead of their bf16
    # casts): its steps stay within fp8 rounding of the bf16 all-gather's
    plain, gathered = merged[2], merged[3]
    assert abs(gathered["next_loss"] - plain["next_loss"]) < LOSS_TOLERANCE / 2
