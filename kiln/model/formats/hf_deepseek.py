"""DeepSeek-V3 `config.json` <-> kiln fields: MLA, the sigmoid grouped router, shared experts,
dense first layers. hf_config.py calls these for `model_type: deepseek_v3`."""

from __future__ import annotations

from kiln.model.config import ModelConfig
from kiln.model.mla_config import MLAConfig
from kiln.platform.errors import ConfigError

# What DeepSeek-V3 is, switch by switch: an export needs each, an import sets them.
_SWITCHES = {
    "router_score": "sigmoid",
    "qkv_bias": False,
    "qk_norm": False,
    "sandwich_norm": False,
    "norm_unit_offset": False,
    "embed_scale": False,
    "ffn_activation": "silu",
    "sliding_window": None,
    "capacity_factor": None,
}


def deepseek_v3_config(cfg: ModelConfig, body: dict) -> dict:
    """HF DeepseekV3 config.json fields of an MLA model with a sigmoid-routed MoE."""
    if not cfg.n_experts:
        raise ConfigError("model.mla without model.n_experts has no Hugging Face export")
    for field, value in _SWITCHES.items():
        if getattr(cfg, field) != value:
            raise ConfigError(f"model.{field}={getattr(cfg, field)!r} has no DeepSeek-V3 export")
    m = cfg.mla
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **body,
        "attention_bias": False,
        "kv_lora_rank": m.kv_lora_rank,
        "q_lora_rank": m.q_lora_rank,
        "qk_nope_head_dim": m.qk_nope_head_dim,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "qk_head_dim": m.qk_head_dim,
        "v_head_dim": m.v_head_dim,
        "rope_interleave": m.rope_interleave,
        "moe_intermediate_size": cfg.expert_hidden_dim,
        "n_routed_experts": cfg.n_experts,
        "n_shared_experts": cfg.n_shared_experts,
        "num_experts_per_tok": cfg.top_k,
        "n_group": cfg.n_expert_groups,
        "topk_group": cfg.topk_groups,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "norm_topk_prob": cfg.norm_topk_prob,
        "first_k_dense_replace": cfg.first_dense_layers,
        "num_nextn_predict_layers": cfg.mtp_depth,  # multi-token prediction layers
        "output_router_logits": False,
    }


def deepseek_v3_fields(hf: dict, cfg: dict) -> dict:
    """Kiln fields of a DeepSeek-V3 config.json, on top of the common ones in `cfg`."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError("config.json: hidden_act must be silu (DeepSeek-V3)")
    if not hf.get("n_routed_experts"):
        raise ConfigError("config.json: n_routed_experts must be set (DeepSeek-V3 is an MoE)")
    mla = MLAConfig(
        kv_lora_rank=hf["kv_lora_rank"],
        q_lora_rank=hf.get("q_lora_rank"),
        qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        rope_interleave=bool(hf.get("rope_interleave", True)),
    )
    return {
        **cfg,
        **_SWITCHES,
        "mla": mla,
        "head_dim": mla.qk_rope_head_dim,
        "n_kv_heads": hf["num_attention_heads"],
        "n_experts": hf["n_routed_experts"],
        "top_k": hf.get("num_experts_per_tok", 8),
        "moe_hidden_dim": hf["moe_intermediate_size"],
        "n_shared_experts": hf.get("n_shared_experts") or 0,
        "first_dense_layers": hf.get("first_k_dense_replace") or 0,
        "n_expert_groups": hf.get("n_group") or 1,
        "topk_groups": hf.get("topk_group") or 1,
        "routed_scaling_factor": hf.get("routed_scaling_factor", 1.0),
        "norm_topk_prob": bool(hf.get("norm_topk_prob", True)),
        "moe_aux_loss_coef": 0.0,  # aux-loss-free: the router's bias balances the experts
        "mtp_depth": hf.get("num_nextn_predict_layers") or 0,
    }
