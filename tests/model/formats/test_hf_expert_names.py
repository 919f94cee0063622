"""3-D expert weights at the Hugging Face boundary: one tensor per expert and projection out,
stacked back in, bit for bit."""

from __future__ import annotations

import torch

from kiln.model import ModelConfig, Transformer
from kiln.model.formats.hf_names import from_hf_state, to_hf_state


def test_mixtral_experts_split_and_stack_exactly():
    cfg = ModelConfig.preset("tiny", n_layers=1, n_experts=4, top_k=2)
    state = Transformer(cfg).state_dict()
    hf = to_hf_state(state, cfg)
    experts = state["layers.0.moe.experts.w13"]
    hidden = cfg.ffn_hidden_dim
    for j in range(4):
        prefix = f"model.layers.0.block_sparse_moe.experts.{j}"
        assert torch.equal(hf[f"{prefix}.w1.weight"], experts[j, :hidden])
        assert torch.equal(hf[f"{prefix}.w3.weight"], experts[j, hidden:])
        assert torch.equal(hf[f"{prefix}.w2.weight"], state["layers.0.moe.experts.w2"][j])
    assert not any("w13" in k or k.endswith("experts.w2") for k in hf)
    back = from_hf_state(hf, cfg)
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name
