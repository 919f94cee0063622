"""PEFT LoRA adapter folders: what `peft`'s `save_pretrained` writes for a Llama model, read and
written with kiln's adapter names.

The folder holds `adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules in HF
names) and `adapter_model.safetensors` with keys `base_model.model.<HF module>.lora_A.weight` /
`.lora_B.weight` (peft drops the adapter name "default" when saving).
"""

from __future__ import annotations

import json
import os

import torch

from kiln.model.lora import LoRAConfig, adapter_state_dict
from kiln.platform.errors import InputError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
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
_KILN_MODULE = {hf: kiln for kiln, hf in HF_MODULE.items()}
_KILN_BLOCK = {hf: kiln for kiln, hf in _HF_BLOCK.items()}
_UNSUPPORTED = ("modules_to_save", "rank_pattern", "alpha_pattern", "use_dora", "fan_in_fan_out")


def is_peft_folder(path: str) -> bool:
    return os.path.exists(os.path.join(path, CONFIG_FILE))


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
    save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE), {"format": "pt"})
    config = peft_adapter_config(cfg, base_model_name_or_path)
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2)
    return {"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values())}


def _kiln_adapter_name(peft_name: str, folder: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.lora_A[.default].weight` ->
    `layers.0.attention.wq.lora_a`."""
    parts = peft_name.removeprefix("base_model.model.model.").split(".")
    parts = [p for p in parts if p not in ("default", "weight")]
    if len(parts) != 5 or parts[0] != "layers" or parts[4] not in ("lora_A", "lora_B"):
        raise InputError(f"{folder}: adapter tensor {peft_name!r} is not a Llama LoRA A/B")
    _, index, block, module, ab = parts
    if block not in _KILN_BLOCK or module not in _KILN_MODULE:
        raise InputError(f"{folder}: adapter tensor {peft_name!r} targets no dense Llama linear")
    return f"layers.{index}.{_KILN_BLOCK[block]}.{_KILN_MODULE[module]}.{ab.lower()}"


def read_peft_tensors(folder: str) -> tuple[dict, dict[str, torch.Tensor], float]:
    """(adapter_config.json, kiln-named adapters, scaling) of a PEFT LoRA adapter folder,
    whichever base it names (a server checks the tensors against the model it serves)."""
    from safetensors.torch import load_file

    with open(os.path.join(folder, CONFIG_FILE)) as f:
        config = json.load(f)
    unsupported = [key for key in _UNSUPPORTED if config.get(key)]
    if config.get("peft_type", "LORA") != "LORA" or config.get("bias", "none") != "none":
        unsupported.append("peft_type/bias")
    if unsupported:
        raise InputError(f"{folder}/{CONFIG_FILE}: unsupported LoRA options {unsupported}")
    rank, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    tensors = load_file(os.path.join(folder, WEIGHTS_FILE))
    return config, {_kiln_adapter_name(k, folder): v for k, v in tensors.items()}, scaling


def read_peft_adapter(
    folder: str, base: str | None = None
) -> tuple[str, dict[str, torch.Tensor], float]:
    """(base path, kiln-named adapters, scaling) of a PEFT LoRA adapter folder; the base defaults
    to the adapter's `base_model_name_or_path` and must be a local model."""
    config, adapters, scaling = read_peft_tensors(folder)
    base = base or config.get("base_model_name_or_path")
    if not base or not os.path.exists(base):
        raise InputError(
            f"{folder}/{CONFIG_FILE}: base_model_name_or_path {base!r} is not a local model"
        )
    return base, adapters, scaling
