"""The trainer under cp=2, cp=4, ep=2 (MoE) and tp=2 x cp=2: losses equal one process (fp32)."""

from __future__ import annotations

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import train_losses

MOE = {"n_experts": 4, "top_k": 2, "moe_aux_loss_coef": 0.01}
WINDOW = {"n_kv_heads": 1, "sliding_window": 12}  # MQA + a window shorter than the sequence
# world size -> (name, parallel, model, optimizer) layouts run in one process group
LAYOUTS = {
    2: [("cp2", {"cp": 2}, {}, {}), ("ep2-moe", {"dp_shard": 2, "ep": 2}, MOE, {})],
    4: [("cp4-mqa-window", {"cp": 4}, WINDOW, {}), ("tp2-cp2", {"tp": 2, "cp": 2}, {}, {})],
}
_single: dict[str, list[float]] = {}


def _single_process(model: dict, optimizer: dict) -> list[float]:
    key = repr((sorted(model.items()), sorted(optimizer.items())))
    if key not in _single:
        _single[key] = train_losses([({}, model, optimizer)])[0]
    return _single[key]


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_layouts_match_single_process(world):
    layouts = LAYOUTS[world]
    # The loss of step 3 is the loss after 2 optimizer steps; every step is compared.
    expected = [_single_process(model, opt) for _, _, model, opt in layouts]
    per_rank = run_distributed(train_losses, world, [layout[1:] for layout in layouts])
    for rank, results in enumerate(per_rank):
        for (name, *_), losses, want in zip(layouts, results, expected, strict=False):
            assert losses == pytest.approx(want, abs=1e-5), (name, rank, losses, want)
