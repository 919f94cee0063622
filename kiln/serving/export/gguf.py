"""`export_gguf`: a kiln checkpoint, an HF folder or a Generator written as one llama.cpp GGUF
file (kiln.model.formats.gguf_writer), with the tokenizer and chat template found beside it."""

from __future__ import annotations

import json
import os

from kiln.model.formats.gguf_writer import write_gguf
from kiln.serving.export.hf import resolve_source


def _tokenizer_config(tok_dir: str | None) -> dict:
    path = os.path.join(tok_dir, "tokenizer_config.json") if tok_dir else None
    if path is None or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def export_gguf(
    source, path: str, *, tokenizer=None, gguf_type: str = "f32", name: str = "kiln"
) -> dict:
    """Write `source` as the GGUF file `path`; returns the writer's summary plus the parameter
    count."""
    cfg, state, tok, tok_dir = resolve_source(source, tokenizer)
    summary = write_gguf(
        cfg,
        state,
        path,
        tok=tok,
        tok_config=_tokenizer_config(tok_dir),
        gguf_type=gguf_type,
        name=name,
    )
    tied = cfg.tie_embeddings and "output.weight" in state
    params = sum(t.numel() for k, t in state.items() if not (tied and k == "output.weight"))
    return {**summary, "parameters": int(params)}
