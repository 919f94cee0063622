"""llama.cpp's architectures as Kiln reads and writes them: tensor names, stacked experts, the
Gemma norm convention, and the Kiln config each architecture implies (one place, as
hf_names.py is for Hugging Face).

    llama     Llama, Mistral: q/k rows permuted for llama.cpp's adjacent-pair RoPE
    qwen2     q/k/v biases
    qwen3     qk-norm (attn_q_norm, attn_k_norm); head width from attention.key_length
    qwen3moe  qwen3 with every FFN sparse: router ffn_gate_inp, experts stacked per layer
              (ffn_gate_exps, ffn_up_exps, ffn_down_exps: experts x out x in); llama.cpp
              renormalises the top-k weights (norm_topk_prob) unless expert_weights_norm says no
    gemma3    sandwich norms (post_attention_norm, post_ffw_norm), GeGLU, embeddings scaled by
              sqrt(dim), qk-norm, every norm stored as 1 + w (llama.cpp's converter adds the
              1 that Gemma's RMSNorm adds at run time). What the metadata leaves out llama.cpp
              fixes: every 6th layer global, local RoPE base 10000, scores scaled by
              head_dim**-0.5 (dim / n_heads for the 62-layer 27B).

Torch and pydantic only; the `gguf` library is imported by the reader and the writer.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from kiln.model.config import ModelConfig
from kiln.platform.errors import ConfigError

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3")

LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_q.bias": "attention.wq.bias",
    "attn_k.bias": "attention.wk.bias",
    "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "attn_q_norm.weight": "attention.q_norm.weight",
    "attn_k_norm.weight": "attention.k_norm.weight",
    "post_attention_norm.weight": "post_attention_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "post_ffw_norm.weight": "post_ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "ffn_gate_inp.weight": "moe.gate.weight",
}
TOP_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}
# one GGUF tensor per layer and projection holds every expert's matrix [E, out, in]; kiln's
# GroupedExperts holds w13 [E, 2H, D] (gate rows, then up rows) and w2 [E, D, H]
EXPERT_NAMES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
_GROUPED = re.compile(r"layers\.(\d+)\.moe\.experts\.(w13|w2)")

GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_THETA = 10_000.0
_GEMMA3_27B_LAYERS = 62


def norm_offset(arch: str, kiln_name: str) -> float:
    """What llama.cpp's file adds to this kiln weight (Gemma's norms: 1)."""
    return 1.0 if arch == "gemma3" and kiln_name.endswith("norm.weight") else 0.0


def experts_to_kiln(layer: str, stacked: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's `ffn_{gate,up,down}_exps` as kiln's `experts.w13` and `experts.w2`."""
    gate, up, down = (stacked[name] for name in EXPERT_NAMES)
    prefix = f"layers.{layer}.moe.experts"
    return {f"{prefix}.w13": torch.cat([gate, up], dim=1), f"{prefix}.w2": down}


def experts_to_gguf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """kiln's state with each layer's `experts.w13` / `experts.w2` under llama.cpp's names
    (`blk.{i}.ffn_gate_exps.weight`, ...); every other entry kept."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        m = _GROUPED.fullmatch(name)
        if m is None:
            out[name] = tensor
        elif m.group(2) == "w2":
            out[f"blk.{m.group(1)}.ffn_down_exps.weight"] = tensor
        else:
            gate, up = tensor.chunk(2, dim=1)
            out[f"blk.{m.group(1)}.ffn_gate_exps.weight"] = gate
            out[f"blk.{m.group(1)}.ffn_up_exps.weight"] = up
    return out


def architecture_fields(arch: str, meta: dict[str, Any], get) -> dict[str, Any]:
    """The ModelConfig fields `arch` implies beyond the shape every architecture has; `get`
    reads `<arch>.<key>` (with a default) from the metadata."""
    if arch != "qwen3moe" and get("expert_count", 0):
        raise ConfigError(f"GGUF {arch}.expert_count: experts are read for qwen3moe only")
    fields: dict[str, Any] = {"qkv_bias": arch == "qwen2", "qk_norm": arch in ARCHITECTURES[2:]}
    if arch == "qwen3moe":
        fields.update(
            n_experts=get("expert_count"),
            top_k=get("expert_used_count"),
            ffn_hidden_dim=get("expert_feed_forward_length"),
            norm_topk_prob=bool(get("expert_weights_norm", True)),
            capacity_factor=None,
            # training-only, so GGUF has no key: Qwen3-MoE's own value (its HF default)
            moe_aux_loss_coef=0.001,
        )
    if arch == "gemma3":
        if get("attn_logit_softcapping", 0):
            raise ConfigError("GGUF gemma3.attn_logit_softcapping: llama.cpp's gemma3 has none")
        window = get("attention.sliding_window", 0)
        dim, heads = get("embedding_length"), get("attention.head_count")
        fields.update(
            norm_unit_offset=True,
            sandwich_norm=True,
            embed_scale=True,
            ffn_activation="gelu_tanh",
            sliding_window=window or None,
            sliding_window_pattern=GEMMA3_SLIDING_PATTERN if window else None,
            rope_local_theta=GEMMA3_LOCAL_THETA if window else None,
            final_logit_softcap=get("final_logit_softcapping", 0) or None,
        )
        if get("block_count") == _GEMMA3_27B_LAYERS:
            fields["query_pre_attn_scalar"] = dim // heads
    return fields


def export_architecture(cfg: ModelConfig) -> str:
    """llama.cpp's architecture for `cfg`, or a ConfigError naming the first field whose value
    that architecture would not compute."""
    if cfg.sandwich_norm:
        arch = "gemma3"
    elif cfg.qk_norm:
        arch = "qwen3moe" if cfg.n_experts else "qwen3"
    else:
        arch = "qwen2" if cfg.qkv_bias else "llama"
    gemma = arch == "gemma3"
    window = cfg.sliding_window is not None and cfg.sliding_window < cfg.max_seq_len
    expected: dict[str, Any] = {
        "norm_unit_offset": gemma,
        "embed_scale": gemma,
        "ffn_activation": "gelu_tanh" if gemma else "silu",
        "attn_logit_softcap": None,
        "query_pre_attn_scalar": None,
    }
    if arch != "qwen3moe":
        expected["n_experts"] = 0
    else:
        expected.update(norm_topk_prob=True, rope_scaling=None)
    if gemma:
        expected.update(qk_norm=True, qkv_bias=False, rope_scaling=None)
        if window:
            expected["sliding_window_pattern"] = GEMMA3_SLIDING_PATTERN
            if (cfg.rope_local_theta or cfg.rope_theta) != GEMMA3_LOCAL_THETA:
                raise ConfigError(
                    f"GGUF export (gemma3): model.rope_local_theta must be "
                    f"{GEMMA3_LOCAL_THETA:g}, the local RoPE base llama.cpp uses"
                )
    else:
        # llama.cpp's llama/qwen attend to the whole context: a narrower window would change
        # the logits past it
        expected.update(sliding_window_pattern=None, final_logit_softcap=None)
        if window:
            raise ConfigError(
                f"GGUF export ({arch}): model field sliding_window is not supported "
                "(a window narrower than max_seq_len)"
            )
    for field, want in expected.items():
        got = getattr(cfg, field)
        if got != want:
            raise ConfigError(
                f"GGUF export ({arch}): model field {field} = {got!r} is not supported "
                f"(llama.cpp's {arch} computes {field} = {want!r})"
            )
    return arch
