"""`lora.layers`: adapters on some transformer blocks only. The adapted blocks' adapter gradients
equal those of LoRA on every block (same weights), and no block below them is adapted."""

from __future__ import annotations

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.lora import LoRAConfig, apply_lora, lora_layers
from kiln.model.transformer import Transformer
from kiln.platform.errors import ConfigError


def _model(layers):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", n_layers=4, vocab_size=64))
    apply_lora(model, LoRAConfig(rank=2, layers=layers))
    torch.manual_seed(1)
    for name, layer in lora_layers(model):  # blocks 2-3 alike in both models, B nonzero (A
        if name.startswith(("layers.2.", "layers.3.")):  # gets gradients); 0-1 keep B = 0
            torch.nn.init.normal_(layer.lora_a, std=0.1)
            torch.nn.init.normal_(layer.lora_b, std=0.1)
    return model


def test_last_blocks_only_and_their_gradients_match_all_blocks():
    tokens = torch.randint(0, 64, (2, 16))
    grads = {}
    for layers in (None, [-2, -1]):
        model = _model(layers)
        model(tokens).float().logsumexp(-1).mean().backward()
        grads[str(layers)] = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    some, every = grads["[-2, -1]"], grads["None"]
    assert some and {n.split(".")[1] for n in some} == {"2", "3"}
    for name, g in some.items():
        if name.startswith(("layers.2.", "layers.3.")):
            torch.testing.assert_close(g, every[name])


def test_out_of_range_layers_name_the_field():
    with pytest.raises(ConfigError, match="lora.layers"):
        _model([7])


def test_moe_experts_are_not_lora_targets():
    model = Transformer(ModelConfig.preset("tiny", n_layers=1, n_experts=4, top_k=2))
    with pytest.raises(ConfigError, match=r"lora.targets \['w1'\]"):
        apply_lora(model, LoRAConfig(rank=2, targets=["wq", "w1"]))
    adapted = apply_lora(model, LoRAConfig(rank=2, targets="all-linear"))
    assert adapted == [f"layers.0.attention.{w}" for w in ("wq", "wk", "wv", "wo")]
