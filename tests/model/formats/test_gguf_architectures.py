"""GGUF for Qwen3, Qwen3-MoE and Gemma 3 (llama.cpp's `qwen3`, `qwen3moe`, `gemma3`): Kiln's F32
file, loaded by transformers' own GGUF loader, gives the source's logits; and HF -> GGUF ->
Kiln -> HF gives back the same tensors, byte for byte, and the same model config.

The sources are tiny random transformers models (no downloads) whose shapes keep to what
transformers' GGUF loader reads from the metadata: it takes Qwen3's head width (128) and the
Qwen3-MoE expert width (768) from its own config defaults, and Gemma 3's
`query_pre_attn_scalar` (256, llama.cpp's head_dim) likewise."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from kiln.model.formats.gguf import read_gguf
from kiln.model.formats.gguf_writer import write_gguf
from kiln.model.formats.hf import read_hf_dir, write_hf_dir
from kiln.platform.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

VOCAB = 96
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
}
LENGTHS = [11, 5, 8]
# llama.cpp stores Gemma's norms as 1 + w: float32 gives w back exactly when 1 + w needs no
# bits below its own precision, so the random Gemma norms lie on a 2**-12 grid
GRID = 2.0**12


def _hf_config(arch: str):
    from transformers import Gemma3TextConfig, Qwen3Config, Qwen3MoeConfig

    if arch == "qwen3":
        return Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(
            **COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True
        )
    # 6 layers: llama.cpp's pattern, 5 within a window of 4 (shorter than the prompts), 1 global
    return Gemma3TextConfig(
        **{**COMMON, "num_hidden_layers": 6},
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4,
        final_logit_softcapping=3.0 if arch == "gemma3_softcap" else None,
    )


def _random_hf(arch: str, path: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_hf_config(arch), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
                if arch.startswith("gemma3"):
                    p.copy_(torch.round(p * GRID) / GRID)
            else:
                p.normal_(0.0, 0.3)
    model.eval().save_pretrained(path)
    return model


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for row, n in enumerate(LENGTHS):
        tokens[row, :n], mask[row, :n] = torch.randint(0, VOCAB, (n,), generator=g), 1
    return tokens, mask


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "gemma3"])
def test_transformers_loads_kiln_gguf_with_the_source_logits(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    source = _random_hf(arch, str(tmp_path / "hf"))
    _, cfg, state = read_hf_dir(str(tmp_path / "hf"))
    summary = write_gguf(cfg, state, str(tmp_path / "gguf" / "m.gguf"))
    assert summary["architecture"] == arch.replace("_", "")
    loaded = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "gguf"), gguf_file="m.gguf", dtype=torch.float32
    ).eval()
    tokens, mask = _padded_batch()
    with torch.no_grad():
        ours = loaded(tokens, attention_mask=mask).logits
        theirs = source(tokens, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(ours[keep], theirs[keep], rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "gemma3", "gemma3_softcap"])
def test_hf_gguf_kiln_hf_round_trip_is_byte_identical(arch, tmp_path):
    hf_dir, out_dir = str(tmp_path / "hf"), str(tmp_path / "back")
    _random_hf(arch, hf_dir)
    _, cfg, state = read_hf_dir(hf_dir)
    path = str(tmp_path / "m.gguf")
    write_gguf(cfg, state, path)
    cfg_back, state_back, _ = read_gguf(path)
    # GGUF stores the epsilon as float32
    assert cfg_back.norm_eps == pytest.approx(cfg.norm_eps, rel=1e-7)
    assert cfg_back.model_copy(update={"norm_eps": cfg.norm_eps}) == cfg
    write_hf_dir(cfg_back, state_back, out_dir)
    before = load_file(os.path.join(hf_dir, "model.safetensors"))
    after = load_file(os.path.join(out_dir, "model.safetensors"))
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert tensor.dtype == after[name].dtype, name
        assert tensor.numpy().tobytes() == after[name].numpy().tobytes(), name


@pytest.mark.parametrize("arch", ["qwen3_moe", "gemma3"])
def test_q8_0_weights_within_its_rounding(arch, tmp_path):
    """Q8_0 (int8 per 32 values of a row, times an f16 scale): every weight of every matrix,
    the stacked experts among them, within half a step (1/254 of the block's largest) plus the
    scale's f16 rounding (1/2048 of it) of the source; norms stay F32 and come back exact."""
    _random_hf(arch, str(tmp_path / "hf"))
    _, cfg, state = read_hf_dir(str(tmp_path / "hf"))
    write_gguf(cfg, state, str(tmp_path / "m.gguf"), gguf_type="q8_0")
    _, back, _ = read_gguf(str(tmp_path / "m.gguf"))
    assert sorted(back) == sorted(state)
    for name, source in state.items():
        if source.ndim == 1:
            assert torch.equal(back[name], source), name
            continue
        blocks = source.reshape(-1, 32).abs().amax(dim=1, keepdim=True)
        error = (back[name] - source).reshape(-1, 32).abs()
        assert (error <= blocks * (1 / 254 + 1 / 2048)).all(), name
        assert not torch.equal(back[name], source), name  # quantised, not stored F32


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"qk_norm": True, "n_experts": 4, "norm_topk_prob": False}, "norm_topk_prob"),
        ({"qk_norm": True, "sliding_window": 8}, "sliding_window"),
        (
            {
                "qk_norm": True,
                "sandwich_norm": True,
                "norm_unit_offset": True,
                "embed_scale": True,
                "ffn_activation": "gelu_tanh",
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "rope_local_theta": 10_000.0,
            },
            "sliding_window_pattern",
        ),
        (
            {
                "qk_norm": True,
                "sandwich_norm": True,
                "norm_unit_offset": True,
                "embed_scale": True,
                "ffn_activation": "gelu_tanh",
                "sliding_window": 8,
                "sliding_window_pattern": 6,
                "rope_local_theta": 100.0,
            },
            "rope_local_theta",
        ),
    ],
    ids=["qwen3moe-unnormed", "qwen3-window", "gemma3-pattern", "gemma3-local-theta"],
)
def test_what_llama_cpp_would_compute_differently_is_refused_by_name(fields, named, tmp_path):
    from kiln.model.config import ModelConfig

    with pytest.raises(ConfigError, match=named):
        write_gguf(ModelConfig.preset("tiny", **fields), {}, str(tmp_path / "x.gguf"))
