"""`kiln plan` on Qwen3, Qwen3-MoE, Gemma 3 and DeepSeek-V3 shapes: its parameter count is the
model's (qk-norm, wider heads, sandwich norms, MLA, shared experts) and its FLOPs count the
extra width; a layout that cannot compute a Gemma switch is refused when the config is read."""

from __future__ import annotations

import pytest

from kiln.model.config import ModelConfig
from kiln.model.meta import build_on_meta
from kiln.training.config import TrainConfig
from kiln.training.metrics import flops_per_token
from kiln.training.plan import cpu_stand_in, plan_rank

QWEN3 = {"qk_norm": True, "head_dim": 32}
SHAPES = {
    "qwen3": QWEN3,
    "qwen3_moe": {**QWEN3, "n_experts": 4, "top_k": 2, "norm_topk_prob": False},
    "gemma3": {
        **QWEN3,
        "norm_unit_offset": True,
        "sandwich_norm": True,
        "embed_scale": True,
        "ffn_activation": "gelu_tanh",
        "tie_embeddings": True,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "rope_local_theta": 100.0,
    },
}


@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_plan_counts_the_model_parameters(arch):
    model = {"preset": "tiny", "n_layers": 2, **SHAPES[arch]}
    cfg = cpu_stand_in(
        TrainConfig(model=model, seq_len=32, global_batch_size=2, micro_batch_size=2)
    )
    info = plan_rank(cfg, 0, 1)
    shape = ModelConfig.preset("tiny", n_layers=2, **SHAPES[arch])
    assert info["local_params"] == shape.num_params()
    # heads of 32 (not dim / n_heads = 16) double the q/k/v/o matmuls and the attention
    narrow = shape.model_copy(update={"head_dim": 16})
    assert flops_per_token(shape, 32) > flops_per_token(narrow, 32)


@pytest.mark.parametrize("field", ["query_pre_attn_scalar", "attn_logit_softcap"])
def test_ring_attention_refuses_what_it_does_not_compute(field):
    from kiln.platform.errors import ConfigError

    with pytest.raises(ConfigError, match=f"model.{field}.*parallel.cp"):
        TrainConfig(model={"preset": "tiny", field: 24.0}, parallel={"cp": 2})


DEEPSEEK = {
    "mla": {
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
    },
    "n_experts": 4,
    "top_k": 2,
    "moe_hidden_dim": 32,
    "n_shared_experts": 1,
    "first_dense_layers": 1,
    "router_score": "sigmoid",
    "n_expert_groups": 2,
}


def test_plan_counts_deepseek_v3_mla_and_shared_experts():
    """The planned rank holds the parameters `num_params` counts (MLA's projections and latent
    norms, a dense first layer, routed and shared experts), and the FLOPs count the active
    ones plus attention over MLA's q.k and value widths."""
    model = {"preset": "tiny", "n_layers": 2, **DEEPSEEK}
    cfg = cpu_stand_in(
        TrainConfig(model=model, seq_len=32, global_batch_size=2, micro_batch_size=2)
    )
    shape = ModelConfig.preset("tiny", n_layers=2, **DEEPSEEK)
    assert plan_rank(cfg, 0, 1)["local_params"] == shape.num_params()
    routed_off = 3 * shape.dim * 32 * (4 - 2)  # layer 1: 2 of its 4 experts idle per token
    active = shape.num_params(exclude_embedding=True) - routed_off  # the head included
    attention = 12 * 2 * shape.n_heads * (24 + 12) / 2 * (32 + 1) / 2  # causal: (T+1)/2 keys
    assert flops_per_token(shape, 32) == pytest.approx(6 * active + attention)


def test_plan_counts_deepseek_v3_mtp_modules():
    """With mtp_depth 1 the planned rank also holds the MTP module (its MoE block, norms and
    projection; not the shared embedding and head again), its step runs the module, and the
    FLOPs add its block, projection and one more pass through the head."""
    mtp = {**DEEPSEEK, "mtp_depth": 1}
    cfg = cpu_stand_in(
        TrainConfig(
            model={"preset": "tiny", "n_layers": 2, **mtp},
            seq_len=32,
            global_batch_size=2,
            micro_batch_size=2,
        )
    )
    shape = ModelConfig.preset("tiny", n_layers=2, **mtp)
    plain = ModelConfig.preset("tiny", n_layers=2, **DEEPSEEK)
    info = plan_rank(cfg, 0, 1)
    assert info["local_params"] == shape.num_params() > plain.num_params()
    d = shape.dim
    model = build_on_meta(shape)  # the module: an MoE block like layer 1, 3 norms, eh_proj
    moe_block = sum(p.numel() for p in model.layers["1"].parameters())
    assert shape.num_params() - plain.num_params() == moe_block + 3 * d + 2 * d * d
    routed_off = 2 * 3 * d * 32 * (4 - 2)  # layers 1 and 2 (the module's): 2 of 4 experts idle
    active = shape.num_params(exclude_embedding=True) + 256 * d - routed_off
    attention = 12 * 3 * shape.n_heads * (24 + 12) / 2 * (32 + 1) / 2
    assert flops_per_token(shape, 32) == pytest.approx(6 * active + attention)
