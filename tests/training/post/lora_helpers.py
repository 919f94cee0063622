"""A tiny kiln Llama, its HF export, and peft's LoRA on that export with kiln's A/B."""

from __future__ import annotations

import re

import torch
from torch import nn

from kiln.model.formats.peft import HF_MODULE
from kiln.model.lora import LoRAConfig, LoRALinear, lora_layers
from tests.engine.tiny import tiny_model

VOCAB = 400  # = the chat test tokenizer's vocabulary
_PEFT_NAME = re.compile(r"layers\.(\d+)\.\w+\.(\w+_proj)\.lora_([AB])")
_KILN_OF_HF = {v: k for k, v in HF_MODULE.items()}


def kiln_name_of_peft(name: str) -> str:
    """`...layers.0.self_attn.q_proj.lora_A.default.weight` -> `layers.0.attention.wq.lora_a`."""
    layer, proj, ab = _PEFT_NAME.search(name).groups()
    kiln = _KILN_OF_HF[proj]
    block = "attention" if kiln in ("wq", "wk", "wv", "wo") else "feed_forward"
    return f"layers.{layer}.{block}.{kiln}.lora_{ab.lower()}"


def export_base(root: str):
    """(tiny kiln model, its HF export directory) written under root."""
    from kiln.model.formats.weights import write_model_checkpoint
    from kiln.serving.export.hf import export_hf

    model = tiny_model("llama", VOCAB)
    write_model_checkpoint(f"{root}/ckpt", model.cfg.model_dump(), model.state_dict())
    export_hf(f"{root}/ckpt", f"{root}/hf")
    return model, f"{root}/hf"


def random_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_a.copy_(torch.randn(m.lora_a.shape, generator=g) * 0.2)
                m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * 0.2)


def peft_model(hf_dir: str, cfg: LoRAConfig, kiln_model: torch.nn.Module):
    """peft's get_peft_model on the HF export, with kiln's A/B copied in."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager")
    targets = [HF_MODULE[t] for t in cfg.target_names]
    config = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=targets, lora_dropout=0.0)
    model = get_peft_model(hf, config).eval()
    state = kiln_model.state_dict()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(state[kiln_name_of_peft(name)])
    return model


def adapter_grads(model: torch.nn.Module, peft: bool) -> dict[str, torch.Tensor]:
    """Gradients of the adapter parameters under kiln's names."""
    out = {}
    for name, p in model.named_parameters():
        if "lora_" in name and p.grad is not None:
            out[kiln_name_of_peft(name) if peft else name] = p.grad
    return out


def merge_lora(model: nn.Module) -> None:
    for _, layer in lora_layers(model):
        layer.merge()


def unmerge_lora(model: nn.Module) -> None:
    for _, layer in lora_layers(model):
        layer.unmerge()
