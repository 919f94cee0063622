"""What common Llama-family checkpoints carry, imported from Hugging Face: Llama-3 rope_scaling,
Qwen2's q/k/v biases, tied embeddings; unsupported fields are a ConfigError naming the field."""

from __future__ import annotations

import pytest
import torch

from kiln.model.formats.hf import read_hf_dir
from kiln.model.formats.hf_config import from_hf_config, to_hf_config
from kiln.model.formats.weights import build_model
from kiln.platform.errors import ConfigError

COMMON = {
    "vocab_size": 200,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # short, so positions < 256 reach every band
}
YARN_SCALING = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16}


def _random_hf(config, tmp_path) -> tuple[torch.nn.Module, str]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    path = str(tmp_path / "hf")
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("family", ["llama3_rope", "llama_yarn", "qwen2_bias"])
def test_imported_model_has_the_hf_logits(family, tmp_path):
    from transformers import LlamaConfig, Qwen2Config

    if family == "llama3_rope":
        config = LlamaConfig(**COMMON, rope_theta=50000.0, rope_scaling=LLAMA3_SCALING)
    elif family == "llama_yarn":  # YaRN's frequencies and cos/sin factor; softmax scale as is
        config = LlamaConfig(**COMMON, rope_parameters={"rope_theta": 5e4, **YARN_SCALING})
    else:
        config = Qwen2Config(**COMMON, tie_word_embeddings=True, use_sliding_window=False)
    hf, path = _random_hf(config, tmp_path)
    _, cfg, state = read_hf_dir(path)
    assert (cfg.rope_scaling is not None) == family.startswith("llama")
    assert cfg.qkv_bias == (family == "qwen2_bias")
    assert cfg.tie_embeddings == (family == "qwen2_bias")
    model = build_model(cfg, state, device="cpu")
    tokens = torch.randint(0, 200, (2, 200))  # far past original_max_position_embeddings
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=0, atol=1e-4)
    # and back: the exported config reads as the same kiln config
    assert from_hf_config(to_hf_config(cfg)) == cfg


@pytest.mark.parametrize(
    "field,value",
    [
        ("attention_bias", True),
        ("mlp_bias", True),
        ("rope_scaling", {"rope_type": "longrope", "factor": 4.0}),
        ("model_type", "gpt2"),
    ],
)
def test_unsupported_hf_fields_are_config_errors_naming_them(field, value):
    hf = {"model_type": "llama", **COMMON, field: value}
    name = "rope_scaling" if field == "rope_scaling" else field
    with pytest.raises(ConfigError, match=name):
        from_hf_config(hf)
