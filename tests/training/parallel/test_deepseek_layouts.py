"""DeepSeek-V3's parts train under dp_shard=2, ep=2 and tp=2 as in one process (fp32, 3 steps):
MLA with YaRN, dense first layer, sigmoid grouped router with its balancing bias, shared
experts; under pp=2 with a fixed bias (bias updates under pp, and MLA under cp, are refused by
name)."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import DEEPSEEK, train_config, train_losses

FIXED_BIAS = {**DEEPSEEK, "router_bias_update_rate": 0.0}
LAYOUTS = [
    ("dp2", {"dp_shard": 2}, DEEPSEEK, {}),
    ("ep2", {"dp_shard": 2, "ep": 2}, DEEPSEEK, {}),
    ("tp2", {"tp": 2}, DEEPSEEK, {}),
    ("pp2-fixed-bias", {"pp": 2}, FIXED_BIAS, {}),
]


@pytest.mark.slow
def test_deepseek_layouts_match_single_process():
    single = train_losses([({}, DEEPSEEK, {}), ({}, FIXED_BIAS, {})])
    per_rank = run_distributed(train_losses, 2, [layout[1:] for layout in LAYOUTS])
    for rank, results in enumerate(per_rank):
        for (name, *_), losses in zip(LAYOUTS, results, strict=True):
            want = single[name.endswith("fixed-bias")]
            assert losses == pytest.approx(want, abs=1e-5), (name, rank, losses, want)


def test_mla_under_cp_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"model.mla .* parallel.cp > 1"):
        train_config({"cp": 2}, DEEPSEEK)


def test_router_bias_updates_under_pp_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"model.router_bias_update_rate .* parallel.pp > 1"):
        train_config({"pp": 2}, DEEPSEEK)
    train_config({"pp": 2}, {**DEEPSEEK, "router_bias_update_rate": 0.0})  # a fixed bias runs
