"""Random non-zero LoRA adapters for a tiny model, saved as `kiln sft` saves them (PEFT folders,
kiln.model.formats.peft), and the merged model each one equals: the reference a multi-LoRA
engine's output is checked against."""

from __future__ import annotations

import copy

import torch
from torch import nn

from kiln.model.formats.peft import export_peft_adapter
from kiln.model.lora import LoRAConfig, LoRALinear, apply_lora, merged_state_dict


def make_adapter(
    base: nn.Module, cfg: LoRAConfig, out_dir: str, seed: int, std: float = 0.3
) -> nn.Module:
    """Write a PEFT adapter folder of random A/B (std `std`) over `base`; returns the merged
    model (base weights + scaling * B A), laid out as `base` is."""
    adapted = _unpacked(base)
    apply_lora(adapted, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in adapted.modules():
            if isinstance(m, LoRALinear):
                m.lora_a.copy_(torch.randn(m.lora_a.shape, generator=g) * std)
                m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * std)
    state = adapted.state_dict()
    export_peft_adapter(state, cfg, out_dir)
    merged = copy.deepcopy(base)
    merged.load_state_dict(merged_state_dict(state, cfg.scaling))
    return merged.eval()


def _unpacked(model: nn.Module) -> nn.Module:
    """A copy of `model` with plain `nn.Linear` layers, as training (`kiln sft`) adapts them: a
    served model's may be packed for the CPU's kernels (cpu_linear.pack_for_cpu)."""
    plain = type(model)(model.cfg).to(model.tok_embeddings.weight.dtype)
    plain.load_state_dict(model.state_dict())
    return plain
