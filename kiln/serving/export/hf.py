"""Export a kiln model as a Hugging Face Llama / Mistral / Mixtral directory.

Writes `config.json`, `generation_config.json`, `model.safetensors` and, when a tokenizer is
known, `tokenizer.json` + `tokenizer_config.json`, so `AutoModelForCausalLM.from_pretrained`
and `AutoTokenizer.from_pretrained` load it with no kiln code.
"""

from __future__ import annotations

import json
import os

import torch

from kiln.platform.errors import InputError
from kiln.serving.tokenizer_files import load_tokenizer
from kiln.training.model.config import ModelConfig
from kiln.training.model.hf_names import to_hf_config, to_hf_state
from kiln.training.model.weights import read_weights

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_source(
    source, tokenizer=None
) -> tuple[ModelConfig, dict[str, torch.Tensor], object | None, str | None]:
    """(model config, kiln state dict, tokenizers.Tokenizer or None, its folder or None) from a
    path (checkpoint or HF folder), a kiln `Transformer`, or anything with `.model` and
    `.tokenizer` (a Generator)."""
    if isinstance(source, torch.nn.Module) or hasattr(source, "model"):
        model = source if isinstance(source, torch.nn.Module) else source.model
        tok, tok_dir = getattr(source, "tokenizer", None), getattr(source, "tokenizer_dir", None)
        if tokenizer is not None:
            tok, tok_dir = load_tokenizer(tokenizer, [])
        return model.cfg, model.state_dict(), tok, tok_dir
    path, cfg, state = read_weights(os.fspath(source))
    search = [
        path,
        os.path.dirname(os.path.normpath(path)),
        os.path.dirname(os.path.dirname(os.path.normpath(path))),
    ]
    try:
        tok, tok_dir = load_tokenizer(tokenizer, search)
    except InputError:
        if tokenizer is not None:
            raise
        tok, tok_dir = None, None
    return cfg, state, tok, tok_dir


def _special_tokens(tok) -> dict[str, str]:
    """bos/eos/unk/pad names for tokenizer_config.json, from the tokenizer's own special tokens."""
    if tok is None:
        return {}
    vocab = tok.get_vocab(with_added_tokens=True)
    eos = next(
        (t for t in ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<|end_of_text|>") if t in vocab),
        None,
    )
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


def export_hf(
    source,
    out_dir: str,
    *,
    tokenizer=None,
    dtype: str = "float32",
    model_name: str | None = None,
    blocks: bool = False,
    share_from: str | None = None,
) -> dict:
    """Write `source` (a Generator, a kiln checkpoint dir or an HF dir) as an HF model dir:
    one model.safetensors, or with `blocks` one file per block (hard-linked where an export in
    `share_from` holds the same tensors: kiln/serving/export/shared_weights.py).

    Returns a summary: architecture, parameter count, files written, what was linked.
    """
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise InputError(f"dtype {dtype!r}: expected one of {sorted(_DTYPES)}")
    cfg, state, tok, tok_dir = resolve_source(source, tokenizer)
    os.makedirs(out_dir, exist_ok=True)
    specials = save_tokenizer(tok, out_dir, tok_dir) if tok is not None else {}
    ids = {k: tok.token_to_id(v) for k, v in specials.items()} if tok is not None else {}
    config = to_hf_config(cfg, bos_token_id=ids.get("bos_token"), eos_token_id=ids.get("eos_token"))
    config["torch_dtype"] = dtype
    hf_state = to_hf_state(state, cfg)
    hf_state = {k: v.to("cpu", _DTYPES[dtype]).contiguous() for k, v in hf_state.items()}
    shared = {}
    if blocks:
        from kiln.serving.export.shared_weights import write_blocks

        shared = write_blocks(hf_state, out_dir, share_from)
    else:
        save_file(hf_state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({k: v for k, v in generation.items() if v is not None}, f, indent=2)
    info = {
        "model_name": model_name or getattr(source, "model_name", None),
        "model": cfg.model_dump(mode="json"),
    }
    with open(os.path.join(out_dir, "kiln_export.json"), "w") as f:
        json.dump(info, f, indent=2)  # the served name and the exact kiln shape
    return {
        "architecture": config["architectures"][0],
        "parameters": int(sum(t.numel() for t in hf_state.values())),
        "files": sorted(os.listdir(out_dir)),
        **shared,
    }
