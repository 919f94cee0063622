"""Expert parallelism on 2 gloo ranks equals the single-process MoE (outputs and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from kiln.model.moe import MoE
from tests.training.distributed import run_distributed
from tests.training.parallel._moe_cases import CASES, ep_vs_single, ep_with_replicas


@pytest.mark.slow
def test_expert_parallel_matches_single_process(tmp_path):
    per_rank = run_distributed(ep_vs_single, 2, str(tmp_path / "ckpt"))
    for rank, errors in enumerate(per_rank):
        for case, err, _names in errors:
            assert err < 1e-5, (rank, case, err)
    # Global expert names: rank 0 keeps experts 0..E/2-1, rank 1 the rest.
    names0, names1 = per_rank[0][0][2], per_rank[1][0][2]
    assert "experts.0.w1.weight" in names0 and "experts.2.w1.weight" not in names0
    assert "experts.3.w2.weight" in names1 and "gate.weight" in names1
    # The EP=2 checkpoint loads into a single-process MoE unchanged.
    torch.manual_seed(0)
    expected = MoE(16, 24, *CASES[0]).state_dict()
    loaded = {k: torch.zeros_like(v) for k, v in expected.items()}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "ckpt"))
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.slow
def test_expert_grads_are_summed_over_replicas():
    for err in run_distributed(ep_with_replicas, 4):
        assert err < 1e-5
