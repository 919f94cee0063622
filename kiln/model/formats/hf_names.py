"""Kiln <-> Hugging Face parameter names, one map per architecture (Llama, Mistral, Mixtral,
Qwen2, Qwen3, Qwen3-MoE, Gemma 3, DeepSeek-V3); config.json fields are hf_config.py's.

Torch and safetensors only (no Ray, no transformers): the Triton model repository vendors this
file. RoPE already uses HF's rotate_half convention, so no weight permutation, except DeepSeek's
interleaved RoPE dims (mla_rope_layout.py).
"""

from __future__ import annotations

import re

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.mla_rope_layout import from_interleaved_rope, to_interleaved_rope
from kiln.model.formats.mtp_names import (
    add_shared_copies,
    hf_mtp_layer,
    is_shared_copy,
    layers_as_mtp,
    mtp_as_layers,
    without_mtp,
)
from kiln.platform.errors import InputError

# Per architecture (as torchtitan's state_dict_adapter): (kiln template, HF template) pairs;
# {i} layer, {j} expert. Export uses the architecture's own list; import accepts every list.
_DECODER = [
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    *[
        (f"layers.{{i}}.attention.w{a}.{kind}", f"model.layers.{{i}}.self_attn.{a}_proj.{kind}")
        for a in "qkv"
        for kind in ("weight", "bias")
    ],
    ("layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"),
]
_QK_NORM = [
    (f"layers.{{i}}.attention.{n}_norm.weight", f"model.layers.{{i}}.self_attn.{n}_norm.weight")
    for n in "qk"
]
_MIXTRAL_MOE = [
    ("layers.{i}.moe.gate.weight", "model.layers.{i}.block_sparse_moe.gate.weight"),
    *[
        (
            f"layers.{{i}}.moe.experts.{{j}}.{w}.weight",
            f"model.layers.{{i}}.block_sparse_moe.experts.{{j}}.{w}.weight",
        )
        for w in ("w1", "w2", "w3")
    ],
]
_QWEN_MOE = [
    ("layers.{i}.moe.gate.weight", "model.layers.{i}.mlp.gate.weight"),
    *[
        (
            f"layers.{{i}}.moe.experts.{{j}}.{w}.weight",
            f"model.layers.{{i}}.mlp.experts.{{j}}.{hf}_proj.weight",
        )
        for w, hf in (("w1", "gate"), ("w2", "down"), ("w3", "up"))
    ],
]
# Gemma 3 norms both ends of each branch; its `post_attention_layernorm` is Llama's name for
# the pre-FFN norm, so each architecture reads with its own map.
_GEMMA3 = [
    *[(k, h) for k, h in _DECODER if "layernorm" not in h and ".bias" not in k],
    *_QK_NORM,
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.post_attention_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.pre_feedforward_layernorm.weight"),
    ("layers.{i}.post_ffn_norm.weight", "model.layers.{i}.post_feedforward_layernorm.weight"),
]
# DeepSeek-V3: MLA (torchtitan's names), dense first layers, routed experts with a sigmoid
# router's bias, shared experts, and multi-token prediction layers after the last decoder layer
# (a block plus these four weights; mtp_names.py).
_MLA = [
    (f"layers.{{i}}.attention.{k}.weight", f"model.layers.{{i}}.self_attn.{h}.weight")
    for k, h in (
        ("wq", "q_proj"),
        ("wq_a", "q_a_proj"),
        ("q_norm", "q_a_layernorm"),
        ("wq_b", "q_b_proj"),
        ("wkv_a", "kv_a_proj_with_mqa"),
        ("kv_norm", "kv_a_layernorm"),
        ("wkv_b", "kv_b_proj"),
        ("wo", "o_proj"),
    )
]
_DEEPSEEK_V3 = [
    *[(k, h) for k, h in _DECODER if "self_attn" not in h],
    *_MLA,
    *_QWEN_MOE,
    (
        "layers.{i}.moe.router.e_score_correction_bias",
        "model.layers.{i}.mlp.gate.e_score_correction_bias",
    ),
    *[
        (
            f"layers.{{i}}.shared_experts.{w}.weight",
            f"model.layers.{{i}}.mlp.shared_experts.{hf}_proj.weight",
        )
        for w, hf in (("w1", "gate"), ("w2", "down"), ("w3", "up"))
    ],
    *[
        (f"layers.{{i}}.{k}.weight", f"model.layers.{{i}}.{h}.weight")
        for k, h in (
            ("enorm", "enorm"),
            ("hnorm", "hnorm"),
            ("eh_proj", "eh_proj"),
            ("norm", "shared_head.norm"),
        )
    ],
]
NAME_MAPS: dict[str, list[tuple[str, str]]] = {
    "llama": _DECODER,
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "mixtral": _DECODER + _MIXTRAL_MOE,
    "qwen3": _DECODER + _QK_NORM,
    "qwen3_moe": _DECODER + _QK_NORM + _QWEN_MOE,
    "gemma3_text": _GEMMA3,
    "deepseek_v3": _DEEPSEEK_V3,
}


def _regex(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)")
    return re.compile(f"^{pattern}$")


_TO_HF = {arch: [(_regex(k), h) for k, h in pairs] for arch, pairs in NAME_MAPS.items()}
_TO_KILN = {arch: [(_regex(h), k) for k, h in pairs] for arch, pairs in NAME_MAPS.items()}
# transformers 5 also calls the Mixtral block `mlp` once loaded: Qwen-MoE's names cover it.
_TO_KILN["mixtral"] += _TO_KILN["qwen3_moe"]


def hf_model_type(cfg: ModelConfig) -> str:
    """The HF architecture a kiln config exports as (the key of its `NAME_MAPS` entry)."""
    if cfg.mla is not None:
        return "deepseek_v3"
    if cfg.sandwich_norm:
        return "gemma3_text"
    if cfg.qk_norm:
        return "qwen3_moe" if cfg.n_experts else "qwen3"
    if cfg.n_experts:
        return "mixtral"
    if cfg.qkv_bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window else "llama"


def _rename(name: str, table) -> str | None:
    for pattern, template in table:
        m = pattern.match(name)
        if m:
            return template.format(**m.groupdict())
    return None


# kiln keeps each MoE layer's experts as 3-D weights (GroupedExperts: w13 = [gate; up] rows
# [E, 2H, D], w2 [E, D, H]); the name maps above spell one tensor per expert and projection,
# as Hugging Face does.
_GROUPED = re.compile(r"^(?P<layer>layers\.\d+\.moe\.experts)\.(?P<w>w13|w2)$")
_PER_EXPERT = re.compile(
    r"^(?P<layer>layers\.\d+\.moe\.experts)\.(?P<j>\d+)\.(?P<w>w[123])\.weight$"
)


def split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`layers.i.moe.experts.w13` [E, 2H, D] and `.w2` -> `layers.i.moe.experts.j.w{1,2,3}.weight`
    (each its own storage)."""
    out = {}
    for name, tensor in state.items():
        m = _GROUPED.match(name)
        if m is None:
            out[name] = tensor
            continue
        for j, expert in enumerate(tensor.unbind(0)):
            prefix = f"{m['layer']}.{j}"
            if m["w"] == "w2":
                out[f"{prefix}.w2.weight"] = expert.clone()
            else:
                gate, up = expert.chunk(2, dim=0)
                out[f"{prefix}.w1.weight"], out[f"{prefix}.w3.weight"] = gate.clone(), up.clone()
    return out


def stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `split_experts`: per-expert weights stacked in expert order."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in state.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = tensor
        else:
            groups.setdefault(m["layer"], {}).setdefault(m["w"], {})[int(m["j"])] = tensor
    for layer, weights in groups.items():
        ids = sorted(weights.get("w2", {}))
        complete = all(sorted(weights.get(w, {})) == ids for w in ("w1", "w3"))
        if not ids or ids != list(range(len(ids))) or not complete:
            raise InputError(f"{layer}: w1, w2 and w3 must be present for experts 0..E-1")
        w1, w2, w3 = (weights[f"w{n}"] for n in "123")
        out[f"{layer}.w13"] = torch.stack([torch.cat([w1[j], w3[j]]) for j in ids])
        out[f"{layer}.w2"] = torch.stack([w2[j] for j in ids])
    return out


def to_hf_state(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename a kiln state dict to HF names (lm_head dropped when tied: HF re-ties it on load);
    DeepSeek-V3's multi-token prediction modules become the layers after the last one; the other
    architectures have no place for them and export the main model alone."""
    if cfg.mla is None:
        cfg, state = without_mtp(cfg, state)
    out = {}
    table = _TO_HF[hf_model_type(cfg)]
    for name, tensor in split_experts(to_interleaved_rope(mtp_as_layers(state, cfg), cfg)).items():
        hf = _rename(name, table)
        if hf is None:
            raise InputError(f"checkpoint parameter {name!r} has no Hugging Face name")
        if cfg.tie_embeddings and hf == "lm_head.weight":
            continue
        out[hf] = tensor.detach().contiguous()
    return add_shared_copies(out, state, cfg) if cfg.mtp_depth else out


def from_hf_state(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename an HF state dict to kiln names; splits transformers 5's fused Mixtral experts."""
    out = {}
    table = _TO_KILN[hf_model_type(cfg)]
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
        if name.endswith("rotary_emb.inv_freq") or _skipped_mtp_weight(name, cfg):
            continue
        kiln = _rename(name, table)
        if kiln is None:
            raise InputError(f"Hugging Face parameter {name!r} is not a weight kiln's model has")
        out[kiln] = tensor
    if cfg.tie_embeddings:
        out["output.weight"] = out["tok_embeddings.weight"]
    return layers_as_mtp(stack_experts(from_interleaved_rope(out, cfg)), cfg)


def _skipped_mtp_weight(name: str, cfg: ModelConfig) -> bool:
    """DeepSeek-V3's multi-token prediction layers sit after the last layer (`layers.61` of 61):
    kiln reads the first `mtp_depth` of them (num_nextn_predict_layers) except their copies of
    the shared embedding and head, and skips any beyond, as transformers skips them all."""
    k = hf_mtp_layer(name, cfg)
    return k is not None and (k >= cfg.mtp_depth or is_shared_copy(name))
