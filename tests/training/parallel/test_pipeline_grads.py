"""Pipeline stages under FSDP2: every parameter's gradient equals one process's (fp32), and no
stage hands FSDP a view (its pre-backward hook sits on the stage output; an in-place op on a
view drops it, and torch warns "returned a view tensor"). Under tp x pp the last stage's logits
are `DTensor.to_local()`'s view unless the stage wrapper returns a fresh tensor."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.training.distributed import run_distributed

# (name, parallel) layouts on 4 ranks, run one after the other in one process group
LAYOUTS = [
    ("tp2-pp2", {"tp": 2, "pp": 2, "dp_shard": 1}),  # FSDP2's replicate on each stage
    ("pp2-fsdp2", {"pp": 2, "dp_shard": 2}),  # fully_shard on each stage
]


def _config(parallel: dict):
    from kiln.training.config import TrainConfig

    return TrainConfig(
        model={"preset": "tiny", "n_layers": 2},
        parallel={**parallel, "pp_schedule": "1f1b"} if parallel else {},
        seq_len=16,
        global_batch_size=8,
        micro_batch_size=2,
        steps=1,
        seed=7,
        device="cpu",
        precision="fp32",
        optimizer={"lr": 1e-3, "grad_clip": None},  # the raw gradients
        data={"synthetic": True, "prefetch": 0},
    )


def _plain(name: str) -> str:
    return name.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", "")


def stage_grads(layouts: list[tuple[str, dict]]) -> list[dict]:
    """Per layout: one step's full gradients of this rank's stage parameters, the stage outputs
    FSDP saw that were views, and the warnings raised."""
    import torch
    from torch.distributed.tensor import DTensor

    from kiln.training.trainer import Trainer

    results = []
    for _name, parallel in layouts:
        torch.manual_seed(0)
        views: list[str] = []

        def seen_by_fsdp(module, args, output, views=views):  # runs after FSDP's post-forward
            if isinstance(output, torch.Tensor) and output._base is not None:
                views.append(type(module).__name__)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(_config(parallel)).setup()
            for part in trainer.model_parts:
                part.register_forward_hook(seen_by_fsdp)
            trainer.train_step()
        grads = {}
        for part in trainer.model_parts:
            for name, p in part.named_parameters():
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                grads[_plain(name)] = g.detach().numpy().copy()
        results.append(
            {"grads": grads, "views": views, "warnings": [str(w.message) for w in caught]}
        )
    return results


@pytest.mark.slow
def test_pipeline_stage_gradients_match_one_process_and_fsdp_sees_no_view():
    import torch

    from kiln.training.trainer import Trainer

    torch.manual_seed(0)
    ref = Trainer(_config({})).setup()
    ref.train_step()
    want = {_plain(n): p.grad.numpy() for n, p in ref.model_parts[0].named_parameters()}
    per_rank = run_distributed(stage_grads, 4, LAYOUTS)
    for i, (name, _parallel) in enumerate(LAYOUTS):
        covered = set()
        for rank, results in enumerate(per_rank):
            got = results[i]
            assert not got["views"], (name, rank, got["views"])
            assert not [w for w in got["warnings"] if "view tensor" in w], (name, rank)
            for param, grad in got["grads"].items():
                err = float(np.abs(grad - want[param]).max())
                assert err <= 1e-5, (name, rank, param, err)
            covered |= set(got["grads"])
        assert covered == set(want), (name, set(want) - covered)
