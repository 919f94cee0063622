"""Llama 3.x, Qwen3, Qwen3-MoE and Gemma 3 from Hugging Face folders made here with
`transformers`: kiln's logits equal transformers' on a padded batch of mixed-length prompts,
greedy decoding through the engine equals `generate`, and HF -> kiln -> HF gives back the same
tensors and config."""

from __future__ import annotations

import pytest
import torch

from kiln.model.formats.hf import read_hf_dir
from kiln.model.formats.weights import build_model
from tests.model.hf_parity import (
    assert_greedy_matches_generate,
    assert_hf_round_trip,
    assert_logits_match,
)

VOCAB = 96
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,  # short, so the prompts reach every band
}
# Fields whose value changes what the model computes.
FIELDS = [
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_parameters",
    "tie_word_embeddings",
    "attention_bias",
    "num_experts_per_tok",
    "norm_topk_prob",
    "moe_intermediate_size",
    "hidden_activation",
    "sliding_window",
    "layer_types",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "final_logit_softcapping",
]
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
}


def _hf_config(arch: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    if arch == "llama3.2":  # 3.2 1B/3B: llama3 rope scaling, tied embeddings
        return LlamaConfig(
            **COMMON,
            rope_parameters={"rope_theta": 500000.0, **LLAMA3_SCALING},
            tie_word_embeddings=True,
        )
    if arch == "qwen3":  # head_dim wider than hidden / heads, as Qwen3-0.6B
        return Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True)
    if arch.startswith("gemma3"):  # 2 sliding layers (window 4 < the prompts), then 1 global
        softcap = arch == "gemma3_softcap"  # Gemma 3 sets none; Gemma 2's value where set
        return Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 6},
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            rope_parameters=GEMMA3_ROPE,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=None,
            final_logit_softcapping=3.0 if softcap else None,
        )
    return Qwen3MoeConfig(
        **COMMON,
        head_dim=8,
        moe_intermediate_size=24,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=arch == "qwen3_moe",
    )


def _random_hf(arch: str, path: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_hf_config(arch), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    model.eval().save_pretrained(path)
    return model


ARCHS = ["llama3.2", "qwen3", "qwen3_moe", "qwen3_moe_unnormed", "gemma3", "gemma3_softcap"]
LENGTHS = [11, 5, 8]


@pytest.mark.parametrize("arch", ARCHS)
def test_kiln_matches_transformers(arch, tmp_path):
    hf_dir = str(tmp_path / "hf")
    hf = _random_hf(arch, hf_dir)
    _, cfg, state = read_hf_dir(hf_dir)
    model = build_model(cfg, state, device="cpu").eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]

    assert_logits_match(model, hf, prompts)
    assert_greedy_matches_generate(model, hf, prompts)
    assert_hf_round_trip(cfg, state, hf_dir, str(tmp_path / "back"), FIELDS)


@pytest.mark.parametrize(
    "fields",
    [
        {"qk_norm": True, "head_dim": 24, "tie_embeddings": True},
        {"qk_norm": True, "n_experts": 4, "top_k": 2, "norm_topk_prob": False},
        {"qk_norm": True, "sandwich_norm": True, "norm_unit_offset": True, "tie_embeddings": True},
    ],
    ids=["qwen3", "qwen3_moe", "gemma3"],
)
def test_plan_counts_the_parameters_the_model_has(fields):
    """`kiln plan` and the FLOP count read `num_params`: it counts qk-norm, wider heads and
    sandwich norms."""
    from kiln.model.config import ModelConfig
    from kiln.model.transformer import Transformer

    cfg = ModelConfig.preset("tiny", **fields)
    model = Transformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert model.layers["0"].attention.q_norm.weight.shape == (cfg.head_dim,)


def test_attention_softcap_caps_the_scores_before_the_softmax():
    """Kiln's switch for Gemma 2's attention soft-capping (transformers' Gemma 3 ignores the
    field, so its import refuses it): cap * tanh(s / cap) on the scaled scores, in the
    training path and through the KV cache's mask alike."""
    from kiln.model.attention import AttentionCore

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 6, 8) * 3, torch.randn(1, 2, 6, 8) * 3, torch.randn(1, 2, 6, 8)
    core = AttentionCore(8, sliding_window=4, scale=0.5, softcap=2.0)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = 2.0 * torch.tanh(q @ kk.transpose(-2, -1) * 0.5 / 2.0)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    scores = scores.masked_fill((j > i) | (i - j >= 4), float("-inf"))
    want = torch.softmax(scores, dim=-1) @ vv
    torch.testing.assert_close(core(q, k, v), want)
    mask = ((j <= i) & (i - j < 4))[None, None]
    torch.testing.assert_close(core(q, k, v, mask=mask), want)
    uncapped = AttentionCore(8, sliding_window=4, scale=0.5)(q, k, v)
    assert not torch.allclose(uncapped, want, atol=1e-3)


def test_gemma3_query_scalar_equal_to_head_dim_is_the_plain_scale():
    """Gemma 3 1B/4B/12B set query_pre_attn_scalar = head_dim: no switch, so context
    parallelism (ring attention, plain scale) still takes the model; export writes it back."""
    from kiln.model.formats.hf_config import from_hf_config, to_hf_config

    hf = _hf_config("gemma3").to_dict()
    hf["query_pre_attn_scalar"] = hf["head_dim"]
    cfg = from_hf_config(hf)
    assert cfg.query_pre_attn_scalar is None
    assert to_hf_config(cfg)["query_pre_attn_scalar"] == hf["head_dim"]


def test_gemma3_attention_softcapping_is_refused_by_name():
    from kiln.model.formats.hf_config import from_hf_config
    from kiln.platform.errors import ConfigError

    hf = _hf_config("gemma3").to_dict()
    hf["attn_logit_softcapping"] = 50.0
    with pytest.raises(ConfigError, match="attn_logit_softcapping"):
        from_hf_config(hf)
