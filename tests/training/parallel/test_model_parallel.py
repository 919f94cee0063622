"""The Transformer under context (cp=2, 4) and expert parallelism (ep=2) vs one process."""

from __future__ import annotations

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._model_cases import cp_model_vs_single, ep_model_vs_single


@pytest.mark.slow
# cp=4 runs fewer cases: 4 ranks share 2 cores, and the ring itself is covered by
# test_ring_attention on 4 ranks.
@pytest.mark.parametrize("cp,seq_len,cases", [(2, 24, [0, 1, 2, 3, 4]), (4, 32, [1, 2])])
def test_context_parallel_model_matches_single_process(cp, seq_len, cases):
    for rank_results in run_distributed(cp_model_vs_single, cp, seq_len, cases):
        assert len(rank_results) == len(cases)
        for case, loss_err, grad_err in rank_results:
            assert loss_err < 1e-5 and grad_err < 1e-5, (case, loss_err, grad_err)


@pytest.mark.slow
def test_expert_parallel_model_matches_single_process():
    for rank_results in run_distributed(ep_model_vs_single, 2):
        assert [r for r, _, _ in rank_results] == ["none", "selective"]
        for recompute, loss_err, grad_err in rank_results:
            assert loss_err < 1e-5 and grad_err < 1e-5, (recompute, loss_err, grad_err)
