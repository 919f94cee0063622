"""`export_gguf`: a kiln checkpoint, an HF folder or a Generator written as one llama.cpp GGUF
file (kiln.model.formats.gguf_writer), with the tokenizer and chat template found beside it."""

from __future__ import annotations

import json
import os

from kiln.model.formats.gguf_writer import write_gguf
from kiln.serving.export.hf import resolve_source


def read_tokenizer_config(tok_dir: str | None) -> dict:
    """The tokenizer_config.json in `tok_dir` (special tokens, chat template), or nothing. Newer
    HF folders keep the chat template in `chat_template.jinja` beside it: that one is used when
    the config has none, as llama.cpp's converter does."""
    if not tok_dir:
        return {}
    config = {}
    path = os.path.join(tok_dir, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    jinja = os.path.join(tok_dir, "chat_template.jinja")
    if not config.get("chat_template") and os.path.isfile(jinja):
        with open(jinja) as f:
            config["chat_template"] = f.read()
    return config


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
        tok_config=read_tokenizer_config(tok_dir),
        gguf_type=gguf_type,
        name=name,
    )
    tied = cfg.tie_embeddings and "output.weight" in state
    params = sum(t.numel() for k, t in state.items() if not (tied and k == "output.weight"))
    return {**summary, "parameters": int(params)}
