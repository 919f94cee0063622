"""DeepSeek-V3's parts train under dp_shard=2, ep=2 and tp=2 as in one process (fp32, 3 steps):
MLA with YaRN, dense first layer, sigmoid grouped router with its balancing bias, shared
experts; under pp=2 with a fixed bias (bias updates under pp, and MLA under cp, are refused by
name)."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError
from tests.training.distributed import run_distributed
from tests.training.parallel._trainer_cases import train_config, train_losses

MLA = {
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
}
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_seq_len": 16,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
DEEPSEEK = {
    "n_experts": 4,
    "top_k": 2,
    "moe_hidden_dim": 32,
    "n_shared_experts": 1,
    "first_dense_layers": 1,
    "router_score": "sigmoid",
    "n_expert_groups": 2,
    "topk_groups": 1,
    "routed_scaling_factor": 2.5,
    # large enough that a bias update from one rank's loads alone would route differently
    "router_bias_update_rate": 0.05,
    "moe_aux_loss_coef": 0.0,  # aux-loss-free, as imports set it (and pp adds no aux loss)
    "mla": MLA,
    "rope_scaling": YARN,
}
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
