"""Aux-loss-free balancing: a trained forward (its backward) counts each expert's assignments,
and the update after the step lowers the bias of experts above the mean load and raises the
others."""

from __future__ import annotations

import torch

from kiln.model.router import SigmoidGroupedRouter
from kiln.training.router_balance import update_router_biases


def test_bias_moves_against_the_load():
    router = SigmoidGroupedRouter(n_experts=4, top_k=1)
    logits = torch.tensor([[5.0, 0.0, 0.0, -5.0]] * 3 + [[0.0, 5.0, 0.0, -5.0]])
    logits.requires_grad_()
    with torch.no_grad():  # evaluation forwards count nothing
        router(logits)
    router(logits)  # a forward nobody trains on (pipeline shape inference) counts nothing
    assert router.load is None
    weights, _, _ = router(logits)  # expert 0 takes 3 tokens, expert 1 one, 2 and 3 none
    weights.sum().backward()
    update_router_biases([router], rate=0.1)
    torch.testing.assert_close(router.e_score_correction_bias, torch.tensor([-0.1, 0, 0.1, 0.1]))
    assert router.load is None  # counted afresh for the next step

    # the bias steers the choice, not the weight: expert 2 now wins a tie with expert 1
    tie = torch.tensor([[0.0, 1.0, 1.0, -5.0]])
    with torch.no_grad():
        weights, ids, _ = router(tie)
    assert ids.tolist() == [[2]] and weights.item() == 1.0  # normalised unbiased score
