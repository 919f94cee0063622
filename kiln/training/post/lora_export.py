"""LoRA export: a PEFT adapter folder for the HF export of the base, or merged HF weights.

The adapter folder is what `peft`'s `save_pretrained` writes for a Llama model:
`adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules in HF names) and
`adapter_model.safetensors` with keys `base_model.model.<HF module>.lora_A.weight` /
`.lora_B.weight` (peft drops the adapter name "default" when saving).
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

from kiln.platform.errors import InputError
from kiln.training.model.lora import LORA_PARAMS, LoRAConfig, adapter_state_dict, merged_state_dict

HF_MODULE = {
    "wq": "q_proj",
    "wk": "k_proj",
    "wv": "v_proj",
    "wo": "o_proj",
    "w1": "gate_proj",
    "w2": "down_proj",
    "w3": "up_proj",
}
PEFT_SUFFIX = {"lora_a": "lora_A", "lora_b": "lora_B"}


_HF_BLOCK = {"attention": "self_attn", "feed_forward": "mlp"}


def peft_adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """kiln adapter entries (`layers.0.attention.wq.lora_a`) under PEFT's names
    (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`)."""
    out = {}
    for name, tensor in adapter_state_dict(state).items():
        prefix, block, linear, param = name.rsplit(".", 3)  # layers.<i>, block, wq, lora_a
        if block not in _HF_BLOCK or linear not in HF_MODULE:
            raise InputError(f"adapter {name!r} has no PEFT name (only dense Llama linears)")
        hf_module = f"model.{prefix}.{_HF_BLOCK[block]}.{HF_MODULE[linear]}"
        out[f"base_model.model.{hf_module}.{PEFT_SUFFIX[param]}.weight"] = tensor
    return out


def peft_adapter_config(cfg: LoRAConfig, base_model_name_or_path: str | None = None) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(HF_MODULE[t] for t in cfg.target_names),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
    }


def export_peft_adapter(
    state: dict[str, torch.Tensor],
    cfg: LoRAConfig,
    out_dir: str,
    base_model_name_or_path: str | None = None,
) -> dict:
    """Write `adapter_config.json` + `adapter_model.safetensors`; returns a summary."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in peft_adapter_state(state).items()}
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), {"format": "pt"})
    config = peft_adapter_config(cfg, base_model_name_or_path)
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return {"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values())}


def export_merged_hf(
    model_cfg: dict,
    state: dict[str, torch.Tensor],
    cfg: LoRAConfig | None,
    out_dir: str,
    *,
    tokenizer=None,
    dtype: str = "float32",
) -> dict:
    """Adapters merged into the base weights (`cfg` None: a full fine-tune, nothing to merge),
    written as a HF model directory by kiln's export_hf."""
    from kiln.serving.export.hf import export_hf
    from kiln.serving.import_hf import write_model_checkpoint

    merged = merged_state_dict(state, cfg.scaling) if cfg is not None else dict(state)
    if model_cfg.get("tie_embeddings"):
        merged.pop("output.weight", None)
    assert not any(k.rsplit(".", 1)[-1] in LORA_PARAMS for k in merged)
    with tempfile.TemporaryDirectory(prefix="kiln-lora-merge-") as tmp:
        write_model_checkpoint(tmp, model_cfg, merged)
        return export_hf(tmp, out_dir, tokenizer=tokenizer, dtype=dtype)
