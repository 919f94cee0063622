"""Hugging Face Llama / Mistral / Mixtral / Qwen2 folders: read (sharded) safetensors + config.json
into kiln names, and write `config.json`, `generation_config.json`, `model.safetensors` and, when
a tokenizer is known, `tokenizer.json` + `tokenizer_config.json`, so
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load it with no kiln
code. Parameter names are translated by `hf_names`, config fields by `hf_config`."""

from __future__ import annotations

import json
import os

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.hf_config import from_hf_config, to_hf_config
from kiln.model.formats.hf_names import from_hf_state, to_hf_state
from kiln.model.formats.mtp_names import held_mtp_depth
from kiln.model.formats.shared_weights import write_blocks
from kiln.platform.errors import InputError
from kiln.text.tokenizer import end_of_text

StateDict = dict[str, torch.Tensor]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_hf_dir(hf_dir: str) -> tuple[dict, ModelConfig, StateDict]:
    """(HF config.json, kiln config, kiln-named state dict) of a folder of (sharded) safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(config_path):
        raise InputError(f"{hf_dir}: no config.json (expected a Hugging Face model directory)")
    with open(config_path) as f:
        hf = json.load(f)
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(hf_dir, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise InputError(f"{hf_dir}: no model.safetensors (only safetensors weights are read)")
    state: StateDict = {}
    for name in files:
        try:
            state.update(load_file(os.path.join(hf_dir, name)))
        except SafetensorError as exc:  # truncated or corrupt: one line, never a crash
            raise InputError(
                f"{os.path.join(hf_dir, name)}: unreadable safetensors ({exc})"
            ) from exc
    cfg = from_hf_config(hf)
    depth = held_mtp_depth(state, cfg)
    if depth != cfg.mtp_depth:  # multi-token prediction layers announced but not saved
        cfg = cfg.model_copy(update={"mtp_depth": depth})
    return hf, cfg, from_hf_state(state, cfg)


def find_hf_dir(model_dir: str) -> str:
    """The Hugging Face dir of an ExportedModel (`<dir>/hf`) or the dir itself."""
    for cand in (os.path.join(model_dir, "hf"), model_dir):
        if os.path.exists(os.path.join(cand, "config.json")):
            return cand
    if os.path.exists(os.path.join(model_dir, "adapter_config.json")):  # PEFT LoRA on its base
        return model_dir
    raise InputError(f"{model_dir}: no exported Hugging Face model (config.json) here or in hf/")


def _special_tokens(tok) -> dict[str, str]:
    """bos/eos/unk/pad names for tokenizer_config.json, from the tokenizer's own special tokens."""
    if tok is None:
        return {}
    vocab = tok.get_vocab(with_added_tokens=True)
    eos = end_of_text(tok)
    bos = next((t for t in ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>") if t in vocab), None)
    unk = next((t for t in ("<unk>", "<|unk|>") if t in vocab), None)
    pad = next((t for t in ("<pad>", "<|pad|>") if t in vocab), None)
    out = {"eos_token": eos, "bos_token": bos, "unk_token": unk, "pad_token": pad or eos}
    return {k: v for k, v in out.items() if v is not None}


def _existing_config(tok_dir: str | None) -> dict:
    """The tokenizer_config.json beside the source tokenizer (an import's chat template, its
    special tokens), or nothing."""
    path = os.path.join(tok_dir, "tokenizer_config.json") if tok_dir else None
    if path is None or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def save_tokenizer(tok, out_dir: str, tok_dir: str | None = None) -> dict[str, str]:
    """tokenizer.json + a tokenizer_config.json that AutoTokenizer understands (keeping what the
    source's own tokenizer_config.json says, e.g. a chat template)."""
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    existing = _existing_config(tok_dir)
    specials = _special_tokens(tok)
    for key in ("eos_token", "bos_token", "unk_token", "pad_token"):
        value = existing.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if value and tok.token_to_id(value) is not None:
            specials[key] = value
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        **existing,
        **specials,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return specials


def write_hf_dir(
    cfg: ModelConfig,
    state: StateDict,
    out_dir: str,
    *,
    tok=None,
    tok_dir: str | None = None,
    dtype: str = "float32",
    model_name: str | None = None,
    blocks: bool = False,
    share_from: str | None = None,
) -> dict:
    """Write (config, kiln-named state) and the tokenizer `tok` (if any) as an HF model folder:
    one model.safetensors, or with `blocks` one file per block, hard-linked where the HF folder
    `share_from` holds the same tensors (shared_weights.py).

    Returns a summary: architecture, parameter count, files written, what was linked."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    os.makedirs(out_dir, exist_ok=True)
    specials = save_tokenizer(tok, out_dir, tok_dir) if tok is not None else {}
    ids = {k: tok.token_to_id(v) for k, v in specials.items()} if tok is not None else {}
    config = to_hf_config(cfg, bos_token_id=ids.get("bos_token"), eos_token_id=ids.get("eos_token"))
    config["torch_dtype"] = dtype
    hf_state = to_hf_state(state, cfg)
    hf_state = {k: v.to("cpu", DTYPES[dtype]).contiguous() for k, v in hf_state.items()}
    shared = {}
    if blocks:
        shared = write_blocks(hf_state, out_dir, share_from)
    else:
        save_file(hf_state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({k: v for k, v in generation.items() if v is not None}, f, indent=2)
    info = {"model_name": model_name, "model": cfg.checkpoint_dump()}
    with open(os.path.join(out_dir, "kiln_export.json"), "w") as f:
        json.dump(info, f, indent=2)  # the served name and the exact kiln shape
    return {
        "architecture": config["architectures"][0],
        "parameters": int(sum(t.numel() for t in hf_state.values())),
        "files": sorted(os.listdir(out_dir)),
        **shared,
    }
