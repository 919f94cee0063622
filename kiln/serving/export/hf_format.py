"""Kiln <-> Hugging Face: config fields and parameter names for Llama, Mistral and Mixtral.

Torch and safetensors only (no Ray, no transformers): the Triton model repository copies this
file into its runtime. RoPE already uses HF's rotate_half convention, so no weight permutation.
"""

from __future__ import annotations

import json
import os
import re

import torch

from kiln.platform.errors import InputError

# (kiln regex, HF template), (HF regex, kiln template); {i} layer, {j} expert
_NAME_PAIRS = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("layers.{i}.attention.wq.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("layers.{i}.attention.wk.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("layers.{i}.attention.wv.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("layers.{i}.moe.gate.weight", "model.layers.{i}.block_sparse_moe.gate.weight"),
    (
        "layers.{i}.moe.experts.{j}.w1.weight",
        "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight",
    ),
    (
        "layers.{i}.moe.experts.{j}.w2.weight",
        "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight",
    ),
    (
        "layers.{i}.moe.experts.{j}.w3.weight",
        "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight",
    ),
    # transformers 5 calls the Mixtral block `mlp` once loaded; accept it on import
    ("layers.{i}.moe.gate.weight", "model.layers.{i}.mlp.gate.weight"),
]


def _regex(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
    return re.compile(f"^{pattern}$")


_TO_HF = [(_regex(k), h) for k, h in _NAME_PAIRS[:-1]]
_TO_KILN = [(_regex(h), k) for k, h in _NAME_PAIRS]


def _rename(name: str, table) -> str | None:
    for pattern, template in table:
        m = pattern.match(name)
        if m:
            return template.format(**m.groupdict())
    return None


def kiln_to_hf_state(
    state: dict[str, torch.Tensor], tie_embeddings: bool
) -> dict[str, torch.Tensor]:
    """Rename a kiln state dict to HF names (lm_head dropped when tied: HF re-ties it on load)."""
    out = {}
    for name, tensor in state.items():
        hf = _rename(name, _TO_HF)
        if hf is None:
            raise InputError(f"checkpoint parameter {name!r} has no Hugging Face name")
        if tie_embeddings and hf == "lm_head.weight":
            continue
        out[hf] = tensor.detach().contiguous()
    return out


def hf_to_kiln_state(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """Rename an HF state dict to kiln names; splits transformers 5's fused Mixtral experts."""
    out = {}
    for name, tensor in state.items():
        fused = re.match(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if fused:
            layer, kind = fused.groups()
            for j, expert in enumerate(tensor):
                prefix = f"layers.{layer}.moe.experts.{j}"
                if kind == "down_proj":
                    out[f"{prefix}.w2.weight"] = expert.contiguous()
                else:
                    gate, up = expert.chunk(2, dim=0)
                    out[f"{prefix}.w1.weight"] = gate.contiguous()
                    out[f"{prefix}.w3.weight"] = up.contiguous()
            continue
        if name.endswith("rotary_emb.inv_freq"):
            continue
        kiln = _rename(name, _TO_KILN)
        if kiln is None:
            raise InputError(
                f"Hugging Face parameter {name!r} is not a Llama/Mistral/Mixtral weight"
            )
        out[kiln] = tensor
    if cfg.get("tie_embeddings") and "output.weight" not in out:
        out["output.weight"] = out["tok_embeddings.weight"]
    return out


def hf_config(
    cfg: dict, *, bos_token_id: int | None = None, eos_token_id: int | None = None
) -> dict:
    """HF `config.json` for a kiln model config: Mixtral if MoE, Mistral if sliding window, else Llama."""
    head_dim = cfg["dim"] // cfg["n_heads"]
    body = {
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["dim"],
        "intermediate_size": cfg["ffn_hidden_dim"],
        "num_hidden_layers": cfg["n_layers"],
        "num_attention_heads": cfg["n_heads"],
        "num_key_value_heads": cfg.get("n_kv_heads") or cfg["n_heads"],
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg["max_seq_len"],
        "rms_norm_eps": cfg["norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        "tie_word_embeddings": bool(cfg.get("tie_embeddings", False)),
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if cfg.get("n_experts"):
        return {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            **body,
            "sliding_window": cfg.get("sliding_window"),
            "num_local_experts": cfg["n_experts"],
            "num_experts_per_tok": cfg["top_k"],
            "router_aux_loss_coef": cfg.get("moe_aux_loss_coef", 0.01),
            "output_router_logits": False,
            "router_jitter_noise": 0.0,
        }
    if cfg.get("sliding_window"):
        return {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            **body,
            "sliding_window": cfg["sliding_window"],
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **body,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "rope_scaling": None,
    }


def kiln_config(hf: dict) -> dict:
    """Kiln model config (a dict for `ModelConfig`) from an HF Llama/Mistral/Mixtral config.json."""
    model_type = hf.get("model_type")
    if model_type not in ("llama", "mistral", "mixtral"):
        raise InputError(f"config.json: model_type {model_type!r} is not llama, mistral or mixtral")
    for unsupported in ("attention_bias", "mlp_bias"):
        if hf.get(unsupported):
            raise InputError(f"config.json: {unsupported}=true is not supported by kiln's model")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise InputError(
            f"config.json: rope type {rope.get('rope_type')!r} is not supported (default only)"
        )
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if head_dim * heads != hf["hidden_size"]:
        raise InputError(
            "config.json: head_dim * num_attention_heads must equal hidden_size for kiln"
        )
    window = hf.get("sliding_window") if model_type != "llama" else None
    if hf.get("use_sliding_window") is False:
        window = None
    cfg = {
        "vocab_size": hf["vocab_size"],
        "dim": hf["hidden_size"],
        "n_layers": hf["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": hf.get("num_key_value_heads") or heads,
        "ffn_hidden_dim": hf["intermediate_size"],
        "norm_eps": hf.get("rms_norm_eps", 1e-5),
        "rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        "max_seq_len": hf.get("max_position_embeddings", 2048),
        "sliding_window": window,
        "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }
    if model_type == "mixtral":
        cfg.update(
            n_experts=hf["num_local_experts"],
            top_k=hf.get("num_experts_per_tok", 2),
            capacity_factor=None,
            moe_aux_loss_coef=hf.get("router_aux_loss_coef", 0.01),
        )
    return cfg


def read_hf_dir(hf_dir: str) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(HF config, kiln config, kiln-named state dict) from a directory of (sharded) safetensors."""
    from safetensors.torch import load_file

    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(config_path):
        raise InputError(f"{hf_dir}: no config.json (expected a Hugging Face model directory)")
    with open(config_path) as f:
        hf = json.load(f)
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise InputError(f"{hf_dir}: no model.safetensors (only safetensors weights are read)")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(os.path.join(hf_dir, name)))
    cfg = kiln_config(hf)
    return hf, cfg, hf_to_kiln_state(state, cfg)
