"""The Transformer under context parallelism (cp=2, 4) and expert parallelism (ep=2) vs one process."""

from __future__ import annotations

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._model_cases import cp_model_vs_single, ep_model_vs_single


@pytest.mark.slow
@pytest.mark.parametrize("cp,seq_len", [(2, 24), (4, 32)])
def test_context_parallel_model_matches_single_process(cp, seq_len):
    for rank_results in run_distributed(cp_model_vs_single, cp, seq_len):
        assert len(rank_results) == 5
        for case, loss_err, grad_err in rank_results:
            assert loss_err < 1e-5 and grad_err < 1e-5, (case, loss_err, grad_err)


@pytest.mark.slow
def test_expert_parallel_model_matches_single_process():
    for rank_results in run_distributed(ep_model_vs_single, 2):
        assert [r for r, _, _ in rank_results] == ["none", "selective", "full"]
        for recompute, loss_err, grad_err in rank_results:
            assert loss_err < 1e-5 and grad_err < 1e-5, (recompute, loss_err, grad_err)
