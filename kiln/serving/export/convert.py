"""`kiln convert`: any model Kiln reads (a Kiln checkpoint in any layout, an HF folder, a GGUF
file) written as an HF folder, a GGUF file or a Kiln checkpoint, tokenizer carried.

    with open_model("model.Q8_0.gguf") as (cfg, state, tok, tok_dir): ...
    convert("ckpt_root", "out.gguf", to="gguf", gguf_type="q8_0")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.gguf import read_gguf
from kiln.model.formats.gguf_tokenizer import write_tokenizer_files
from kiln.model.formats.gguf_writer import write_gguf
from kiln.model.formats.hf import write_hf_dir
from kiln.model.formats.weights import write_model_checkpoint
from kiln.platform.errors import InputError
from kiln.serving.export.gguf import read_tokenizer_config
from kiln.serving.export.hf import resolve_source
from kiln.text.tokenizer import TOKENIZER_FILES, find_tokenizer

TARGETS = ("hf", "gguf", "checkpoint")
ModelParts = tuple[ModelConfig, dict[str, torch.Tensor], object | None, str | None]


@contextlib.contextmanager
def open_model(source: str, tokenizer: str | None = None) -> Iterator[ModelParts]:
    """(config, kiln-named state, tokenizers.Tokenizer or None, its folder or None) of `source`:
    a .gguf file (its tokenizer rebuilt into a folder that lives while the context does), or
    whatever `read_weights` reads."""
    source = os.fspath(source)
    if not source.endswith(".gguf"):
        yield resolve_source(source, tokenizer)
        return
    if not os.path.isfile(source):
        raise InputError(f"{source}: no such GGUF file")
    cfg, state, meta = read_gguf(source)
    with tempfile.TemporaryDirectory(prefix="kiln-gguf-tok-") as tok_dir:
        if tokenizer is not None:
            yield (cfg, state, *find_tokenizer(tokenizer, []))
        elif "tokenizer.ggml.model" in meta:  # a GGUF may carry weights alone
            write_tokenizer_files(meta, tok_dir)
            yield (cfg, state, *find_tokenizer(tok_dir, []))
        else:
            yield cfg, state, None, None


def convert(
    source: str,
    dest: str,
    *,
    to: str,
    tokenizer: str | None = None,
    gguf_type: str = "f32",
    dtype: str = "float32",
) -> dict:
    """Write `source` as `to` (hf: a folder, gguf: a file, checkpoint: a root with step-0 and
    `latest`) at `dest`; returns a summary (architecture, parameters, what was written)."""
    if to not in TARGETS:
        raise InputError(f"--to {to!r}: expected one of {', '.join(TARGETS)}")
    with open_model(source, tokenizer) as (cfg, state, tok, tok_dir):
        if to == "hf":
            return write_hf_dir(cfg, state, dest, tok=tok, tok_dir=tok_dir, dtype=dtype)
        if to == "gguf":
            name = os.path.splitext(os.path.basename(dest))[0]
            config = read_tokenizer_config(tok_dir)
            summary = write_gguf(
                cfg, state, dest, tok=tok, tok_config=config, gguf_type=gguf_type, name=name
            )
            return {**summary, "parameters": _parameters(cfg, state)}
        step = write_model_checkpoint(dest, cfg, state)
        for file in TOKENIZER_FILES if tok_dir else ():  # the tokenizer beside the checkpoint
            if os.path.exists(os.path.join(tok_dir, file)):
                shutil.copyfile(os.path.join(tok_dir, file), os.path.join(dest, file))
        return {"checkpoint": step, "parameters": _parameters(cfg, state)}


def _parameters(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> int:
    tied = cfg.tie_embeddings and "output.weight" in state
    return int(sum(t.numel() for k, t in state.items() if not (tied and k == "output.weight")))
