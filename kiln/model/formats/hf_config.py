"""Kiln <-> Hugging Face `config.json` fields for the architectures hf_names.py maps.

Torch-free apart from the model config (no Ray, no transformers): the Triton model repository
vendors this file with hf_names.py.
"""

from __future__ import annotations

from kiln.model.config import ModelConfig
from kiln.model.formats.hf_deepseek import deepseek_v3_config, deepseek_v3_fields
from kiln.model.formats.hf_names import NAME_MAPS
from kiln.model.rope_scaling import RopeScaling
from kiln.platform.errors import ConfigError


def _rope_fields(cfg: ModelConfig) -> dict:
    if cfg.rope_scaling is None:
        params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
        return {"rope_theta": cfg.rope_theta, "rope_parameters": params, "rope_scaling": None}
    s = cfg.rope_scaling
    if s.rope_type == "yarn":
        params = _yarn_parameters(cfg)
        return {"rope_theta": cfg.rope_theta, "rope_parameters": params, "rope_scaling": params}
    params = {
        "rope_type": "llama3",
        "rope_theta": cfg.rope_theta,
        "factor": s.factor,
        "low_freq_factor": s.low_freq_factor,
        "high_freq_factor": s.high_freq_factor,
        "original_max_position_embeddings": s.original_max_seq_len,
    }
    return {"rope_theta": cfg.rope_theta, "rope_parameters": params, "rope_scaling": params}


def _yarn_parameters(cfg: ModelConfig) -> dict:
    """HF `rope_parameters` of YaRN; optional fields only when set (as DeepSeek writes them)."""
    s = cfg.rope_scaling
    params = {
        "rope_type": "yarn",
        "rope_theta": cfg.rope_theta,
        "factor": s.factor,
        "original_max_position_embeddings": s.original_max_seq_len,
        "beta_fast": s.beta_fast,
        "beta_slow": s.beta_slow,
    }
    optional = {
        "mscale": s.mscale,
        "mscale_all_dim": s.mscale_all_dim,
        "attention_factor": s.attention_factor,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if not s.truncate:
        params["truncate"] = False
    return params


def to_hf_config(
    cfg: ModelConfig, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict:
    """HF `config.json` of the architecture `hf_model_type` names: Qwen3(-MoE) with qk-norm,
    Mixtral if MoE, Qwen2 with q/k/v biases, Mistral with a sliding window, else Llama."""
    body = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        **_rope_fields(cfg),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if cfg.mla is not None:
        return deepseek_v3_config(cfg, body)
    if cfg.sandwich_norm:
        return _gemma3_config(cfg, body)
    if cfg.qk_norm:
        return _qwen3_config(cfg, body)
    if cfg.n_experts:
        if cfg.qkv_bias:
            raise ConfigError("model.qkv_bias with model.n_experts has no Hugging Face export")
        if not cfg.norm_topk_prob:
            raise ConfigError(
                "model.norm_topk_prob=false without model.qk_norm has no Hugging Face export "
                "(Mixtral always renormalises; Qwen3-MoE has qk-norm)"
            )
        return {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            **body,
            "sliding_window": cfg.sliding_window,
            "num_local_experts": cfg.n_experts,
            "num_experts_per_tok": cfg.top_k,
            "router_aux_loss_coef": cfg.moe_aux_loss_coef,
            "output_router_logits": False,
            "router_jitter_noise": 0.0,
        }
    if cfg.qkv_bias:
        if cfg.sliding_window:
            raise ConfigError("model.qkv_bias with model.sliding_window has no Hugging Face export")
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            **body,
            "use_sliding_window": False,
            "sliding_window": None,
        }
    if cfg.sliding_window:
        return {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            **body,
            "sliding_window": cfg.sliding_window,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **body,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
    }


def _qwen3_config(cfg: ModelConfig, body: dict) -> dict:
    """Qwen3 (dense) or Qwen3-MoE: qk-norm, no q/k/v bias, every layer sparse when MoE."""
    for field in ("qkv_bias", "sliding_window"):
        if getattr(cfg, field):
            raise ConfigError(f"model.{field} with model.qk_norm has no Hugging Face export")
    qwen = {**body, "attention_bias": False, "use_sliding_window": False, "sliding_window": None}
    if not cfg.n_experts:
        kinds = ["full_attention"] * cfg.n_layers  # Qwen3 (dense) writes them, Qwen3-MoE not
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **qwen,
            "layer_types": kinds,
        }
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **qwen,
        "moe_intermediate_size": cfg.ffn_hidden_dim,
        "num_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "norm_topk_prob": cfg.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": cfg.moe_aux_loss_coef,
        "output_router_logits": False,
    }


# What Gemma 3 (text) is, switch by switch; an import must find each, an export writes them.
_GEMMA3_SWITCHES = {
    "norm_unit_offset": True,
    "sandwich_norm": True,
    "embed_scale": True,
    "ffn_activation": "gelu_tanh",
    "qk_norm": True,
    "tie_embeddings": True,
    "qkv_bias": False,
    "n_experts": 0,
    "rope_scaling": None,
}


def _gemma3_config(cfg: ModelConfig, body: dict) -> dict:
    """Gemma 3 text: sliding-window layers with their own RoPE base, every N-th layer global."""
    for field, value in {**_GEMMA3_SWITCHES, "attn_logit_softcap": None}.items():
        if getattr(cfg, field) != value:
            raise ConfigError(f"model.{field}={getattr(cfg, field)!r} has no Gemma 3 export")
    kinds = [
        "sliding_attention" if cfg.is_local_layer(i) else "full_attention"
        for i in range(cfg.n_layers)
    ]
    local_theta = cfg.rope_local_theta or cfg.rope_theta
    body = {k: v for k, v in body.items() if k not in ("hidden_act", "rope_theta", "rope_scaling")}
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **body,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local_theta},
        },
        "rope_theta": cfg.rope_theta,
        "rope_local_base_freq": local_theta,
        "sliding_window": cfg.sliding_window,
        "sliding_window_pattern": cfg.sliding_window_pattern,
        "layer_types": kinds,
        "query_pre_attn_scalar": cfg.query_pre_attn_scalar or cfg.head_dim,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": cfg.final_logit_softcap,
        "attention_bias": False,
        "use_bidirectional_attention": False,
    }


def _gemma3_fields(hf: dict, cfg: dict) -> dict:
    """Gemma 3 config.json -> kiln fields; `layer_types` must repeat one sliding/global period."""
    if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ConfigError("config.json: hidden_activation must be gelu_pytorch_tanh (Gemma 3)")
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("config.json: use_bidirectional_attention=true is not supported")
    n = hf["num_hidden_layers"]
    kinds = hf.get("layer_types")
    pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6
    if kinds is not None:
        globals_ = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        pattern = globals_[0] + 1 if globals_ else n + 1
        want = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        if kinds != want:
            raise ConfigError(
                "config.json: layer_types must be every N-th layer global (sliding_window_pattern)"
            )
    rope = hf.get("rope_parameters") or {}
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    for kind in (full, local):
        if kind.get("rope_type", "default") != "default":
            raise ConfigError(
                f"config.json: Gemma 3 rope_type {kind['rope_type']!r} is not supported (default)"
            )
    if hf.get("rope_scaling"):
        raise ConfigError("config.json: Gemma 3 rope_scaling is not supported")
    scalar = hf.get("query_pre_attn_scalar")
    if hf.get("attn_logit_softcapping") is not None:
        # transformers' Gemma 3 stores it but never applies it: neither reading is safe
        raise ConfigError(
            "config.json: attn_logit_softcapping is set, but transformers' Gemma 3 ignores it; "
            "remove it (or set null) to import the model transformers runs"
        )
    return {
        **cfg,
        **_GEMMA3_SWITCHES,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", True)),
        "norm_eps": hf.get("rms_norm_eps", 1e-6),
        "rope_theta": full.get("rope_theta", hf.get("rope_theta", 1_000_000.0)),
        "rope_local_theta": local.get("rope_theta", hf.get("rope_local_base_freq", 10_000.0)),
        "rope_scaling": None,
        "sliding_window": hf.get("sliding_window"),
        "sliding_window_pattern": pattern,
        # None where it is head_dim (Gemma 3 1B/4B/12B): the plain scale, every layout has it
        "query_pre_attn_scalar": None if scalar == cfg["head_dim"] else scalar,
        "final_logit_softcap": hf.get("final_logit_softcapping"),
    }


_MODEL_TYPES = tuple(NAME_MAPS)


def _rope_scaling(hf: dict) -> RopeScaling | None:
    """Llama-3 `rope_scaling` (or transformers 5's `rope_parameters`); others are a ConfigError."""
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind == "yarn":
        old_len = rope.get("original_max_position_embeddings") or hf["max_position_embeddings"]
        return RopeScaling(
            rope_type="yarn",
            factor=rope.get("factor") or hf["max_position_embeddings"] / old_len,
            original_max_seq_len=old_len,
            beta_fast=rope.get("beta_fast") or 32.0,
            beta_slow=rope.get("beta_slow") or 1.0,
            mscale=rope.get("mscale"),
            mscale_all_dim=rope.get("mscale_all_dim"),
            attention_factor=rope.get("attention_factor"),
            truncate=rope.get("truncate", True),
        )
    if kind != "llama3":
        raise ConfigError(
            f"config.json: rope_scaling type {kind!r} is not supported (default, llama3 or yarn)"
        )
    return RopeScaling(
        factor=rope["factor"],
        low_freq_factor=rope.get("low_freq_factor", 1.0),
        high_freq_factor=rope.get("high_freq_factor", 4.0),
        original_max_seq_len=rope.get("original_max_position_embeddings", 8192),
    )


def from_hf_config(hf: dict) -> ModelConfig:
    """Kiln `ModelConfig` from an HF config.json of one of the `NAME_MAPS` architectures."""
    model_type = hf.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ConfigError(f"config.json: model_type {model_type!r} is not one of {_MODEL_TYPES}")
    if hf.get("mlp_bias"):
        raise ConfigError("config.json: mlp_bias=true is not supported by kiln's model")
    if model_type == "qwen3_moe" and (
        hf.get("mlp_only_layers") or hf.get("decoder_sparse_step", 1) != 1
    ):
        raise ConfigError(
            "config.json: mlp_only_layers / decoder_sparse_step != 1 (dense layers between sparse "
            "ones) is not supported; kiln's MoE models are sparse in every layer"
        )
    if model_type != "qwen2" and hf.get("attention_bias"):
        raise ConfigError(
            "config.json: attention_bias=true (a bias on o_proj too) is not supported; "
            "kiln's model has q/k/v biases only (Qwen2)"
        )
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if model_type.startswith("qwen") and hf.get("use_sliding_window"):
        raise ConfigError(
            "config.json: use_sliding_window=true (per-layer windows) is not supported"
        )
    window = hf.get("sliding_window") if model_type in ("mistral", "mixtral") else None
    if hf.get("use_sliding_window") is False:
        window = None
    rope = hf.get("rope_parameters") or {}
    cfg = {
        "vocab_size": hf["vocab_size"],
        "dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": head_dim,
        "ffn_hidden_dim": hf["intermediate_size"],
        "norm_eps": hf.get("rms_norm_eps", 1e-5),
        "rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        "rope_scaling": _rope_scaling(hf),
        "max_seq_len": hf.get("max_position_embeddings", 2048),
        "sliding_window": window,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "qkv_bias": model_type == "qwen2",
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
    }
    if model_type == "mixtral":
        cfg.update(
            n_experts=hf["num_local_experts"],
            top_k=hf.get("num_experts_per_tok", 2),
            capacity_factor=None,
            moe_aux_loss_coef=hf.get("router_aux_loss_coef", 0.01),
        )
    if model_type == "gemma3_text":
        cfg = _gemma3_fields(hf, cfg)
    if model_type == "deepseek_v3":
        cfg = deepseek_v3_fields(hf, cfg)
    if model_type == "qwen3_moe":
        # every layer is sparse, so the experts' width is the one feed-forward width
        cfg.update(
            ffn_hidden_dim=hf["moe_intermediate_size"],
            n_experts=hf.get("num_experts") or hf["num_local_experts"],
            top_k=hf.get("num_experts_per_tok", 8),
            capacity_factor=None,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            moe_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001),
        )
    return ModelConfig(**cfg)
