"""Hugging Face export (transformers loads it, same logits) and import (the original's logits)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kiln.engine.generator import Generator, SamplingParams
from kiln.model.formats.weights import import_model, write_model_checkpoint
from kiln.serving.export.hf import export_hf
from tests.engine.tiny import SHAPES, tiny_model, train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer().save(str(path / "tokenizer.json"))
    return str(path)


def _tokens(vocab_size: int) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, vocab_size, (2, 24))  # longer than the Mistral window (5)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exported_checkpoint_loads_in_transformers_with_equal_logits(
    shape, tokenizer_dir, tmp_path
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kiln.text.tokenizer import find_tokenizer

    tok = find_tokenizer(tokenizer_dir, [])[0]
    model = tiny_model(shape, tok.get_vocab_size())
    ckpt_root = str(tmp_path / "ckpt")
    write_model_checkpoint(ckpt_root, model.cfg.model_dump(), model.state_dict())
    out = str(tmp_path / "hf")
    summary = export_hf(ckpt_root, out, tokenizer=tokenizer_dir)
    assert summary["architecture"] == ARCHITECTURES[shape]
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["architectures"] == [ARCHITECTURES[shape]]

    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(hf).__name__ == ARCHITECTURES[shape]
    tokens = _tokens(model.cfg.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=0, atol=1e-4)
    text = "the quick brown fox"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == tok.encode(text).ids

    # and kiln serves the exported directory exactly as it serves the model
    params = SamplingParams(max_new_tokens=8)
    original = Generator(model, tok, eos_token_ids=[]).generate([text], params)[0]
    loaded = Generator.load(out)
    loaded.eos_token_ids = set()
    assert loaded.generate([text], params)[0].token_ids == original.token_ids


def _hf_model(shape: str, vocab_size: int):
    """A random transformers model of each family (weights with std 0.3, so logits are not ~0)."""
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
    )

    common = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 96,
        "rope_theta": 5000.0,
    }
    config = {
        "llama": lambda: LlamaConfig(**common, tie_word_embeddings=True),
        "mistral": lambda: MistralConfig(**common, sliding_window=5),
        "mixtral": lambda: MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2),
    }[shape]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("shape", list(SHAPES))
def test_imported_hf_model_has_the_original_logits(shape, tmp_path):
    from kiln.model.formats.checkpoint import read_checkpoint
    from kiln.model.formats.weights import build_model
    from kiln.platform.cli import main

    hf = _hf_model(shape, vocab_size=300)
    hf_dir = str(tmp_path / "hf")
    hf.save_pretrained(hf_dir)
    ckpt_root = str(tmp_path / "ckpt")
    if shape == "llama":  # the CLI once; the function for the others
        assert main(["import-hf", hf_dir, "--out", ckpt_root]) == 0
    else:
        import_model(hf_dir, ckpt_root)
    cfg, state = read_checkpoint(ckpt_root)
    assert cfg.sliding_window == (5 if shape == "mistral" else None)
    assert cfg.n_experts == (4 if shape == "mixtral" else 0)
    model = build_model(cfg, state, device="cpu")
    tokens = _tokens(300)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=0, atol=1e-4)
