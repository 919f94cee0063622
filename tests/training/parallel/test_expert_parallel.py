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
    # One name per weight on every rank: each holds rows of the same [E, ., .] tensors.
    names0, names1 = per_rank[0][0][2], per_rank[1][0][2]
    assert names0 == names1 == ["experts.w13", "experts.w2", "gate.weight"]
    # The EP=2 checkpoint (each rank's rows as dim-0 shards) loads into one process unchanged.
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
