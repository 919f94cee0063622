"""Per-block exports: one safetensors file per block plus the standard index, which kiln and
transformers load as the same model; a second export that changed one block hard-links the
other blocks' files of the first instead of copying them; a Triton repository links the
weights of the HF folder it copies."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.shared_weights import INDEX, block_of
from kiln.model.formats.weights import read_weights
from kiln.model.transformer import Transformer
from kiln.serving.export.hf import export_hf

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("tiny", n_layers=3, vocab_size=256)).eval()


def _inode(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_block_names():
    assert block_of("model.layers.7.self_attn.q_proj.weight") == "layers-007"
    assert block_of("model.embed_tokens.weight") == "embed"
    assert block_of("model.norm.weight") == block_of("lm_head.weight") == "head"


def test_a_changed_block_is_written_the_others_linked(tmp_path):
    model = _model()
    base, tuned = str(tmp_path / "base"), str(tmp_path / "tuned")
    first = export_hf(model, base, blocks=True)
    assert first["linked_files"] == 0 and "model.safetensors" not in first["files"]
    assert sorted(f for f in first["files"] if f.endswith(".safetensors")) == [
        "model-embed.safetensors",
        "model-head.safetensors",
        "model-layers-000.safetensors",
        "model-layers-001.safetensors",
        "model-layers-002.safetensors",
    ]
    with torch.no_grad():  # what a LoRA merge on block 1 does
        model.layers["1"].attention.wq.weight.add_(0.01)
    second = export_hf(model, tuned, blocks=True, share_from=base)
    assert second["linked_files"] == 4 and second["linked_bytes"] > 0
    for name in ("embed", "head", "layers-000", "layers-002"):
        file = f"model-{name}.safetensors"
        assert _inode(os.path.join(base, file)) == _inode(os.path.join(tuned, file)), name
    changed = "model-layers-001.safetensors"
    assert _inode(os.path.join(base, changed)) != _inode(os.path.join(tuned, changed))
    # the tuned folder reads back as the tuned model, the base as the base
    _, _, state = read_weights(tuned)
    for name, tensor in model.state_dict().items():
        if name in state:
            torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
    _, _, base_state = read_weights(base)
    assert not torch.equal(
        base_state["layers.1.attention.wq.weight"], state["layers.1.attention.wq.weight"]
    )
    index = json.loads((tmp_path / "tuned" / INDEX).read_text())
    assert index["weight_map"]["model.layers.1.self_attn.q_proj.weight"] == changed
    # removing the base leaves the tuned export whole
    for file in os.listdir(base):
        os.remove(os.path.join(base, file))
    _, _, again = read_weights(tuned)
    assert all(torch.equal(again[k], state[k]) for k in state)


def test_transformers_loads_a_per_block_export(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = _model(seed=1)
    export_hf(model, str(tmp_path / "hf"), blocks=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-4, atol=1e-4)


def test_triton_repository_links_the_weights_it_copies(tmp_path):
    from kiln.serving.export.triton import export_triton
    from tests.serving.rest.tiny_model import make_tiny_model

    hf = make_tiny_model(str(tmp_path / "hf"))
    model_dir = export_triton(hf, str(tmp_path / "repo"), model_name="tiny")
    copied = os.path.join(model_dir, "1", "hf")
    weights = os.path.join(copied, "model.safetensors")
    assert _inode(weights) == _inode(os.path.join(hf, "model.safetensors"))
    config = os.path.join(copied, "tokenizer_config.json")
    assert _inode(config) != _inode(os.path.join(hf, "tokenizer_config.json"))  # copied
