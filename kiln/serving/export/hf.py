"""`export_hf`: a Generator, a kiln `Transformer`, a kiln checkpoint or an HF folder written as a
Hugging Face Llama / Mistral / Mixtral folder (kiln.model.formats.hf), with the tokenizer found
beside the source."""

from __future__ import annotations

import os

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.hf import DTYPES, write_hf_dir
from kiln.model.formats.weights import read_weights
from kiln.platform.errors import InputError
from kiln.text.tokenizer import find_tokenizer


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
            tok, tok_dir = find_tokenizer(tokenizer, [])
        return model.cfg, model.state_dict(), tok, tok_dir
    path, cfg, state = read_weights(os.fspath(source))
    search = [
        path,
        os.path.dirname(os.path.normpath(path)),
        os.path.dirname(os.path.dirname(os.path.normpath(path))),
    ]
    try:
        tok, tok_dir = find_tokenizer(tokenizer, search)
    except InputError:
        if tokenizer is not None:
            raise
        tok, tok_dir = None, None
    return cfg, state, tok, tok_dir


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
    `share_from` holds the same tensors: kiln/model/formats/shared_weights.py).

    Returns a summary: architecture, parameter count, files written, what was linked.
    """
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    cfg, state, tok, tok_dir = resolve_source(source, tokenizer)
    return write_hf_dir(
        cfg,
        state,
        out_dir,
        tok=tok,
        tok_dir=tok_dir,
        dtype=dtype,
        model_name=model_name or getattr(source, "model_name", None),
        blocks=blocks,
        share_from=share_from,
    )
