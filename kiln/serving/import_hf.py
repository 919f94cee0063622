"""`kiln import-hf`: a Hugging Face Llama / Mistral / Mixtral / Qwen2 folder or Hub id (`org/name`,
kiln.serving.hub), or a GGUF file (or an installed package shipping one), becomes a weights-only
kiln checkpoint.

The checkpoint is the checkpointer's own layout (a DCP step folder with `kiln.json`, and a
`latest` pointer), so `train` continues pretraining from it (`init_from:`) and `export` /
`Generator.load` read it like any other. The tokenizer files land next to it.
"""

from __future__ import annotations

import os
import shutil

from kiln.training.model.config import ModelConfig
from kiln.training.model.weights import build_model, read_hf_dir, write_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _model_config(model_cfg) -> ModelConfig:
    return model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig(**model_cfg)


def write_model_checkpoint(out_dir: str, model_cfg, state: dict, *, step: int = 0) -> str:
    """A weights-only kiln checkpoint of (config, kiln-named state); returns the step folder."""
    model = build_model(_model_config(model_cfg), state, device="cpu")
    return write_checkpoint(out_dir, model, step=step)


def read_model(
    source: str, tokenizer_dir: str, revision: str | None = None
) -> tuple[ModelConfig, dict]:
    """(model config, kiln-named state) of `source` (an HF folder or Hub id, a .gguf file or a
    package shipping one); its tokenizer files are written into `tokenizer_dir`."""
    from kiln.serving.hub import local_model

    source = local_model(source, revision)
    os.makedirs(tokenizer_dir, exist_ok=True)
    if not os.path.isdir(source):  # a .gguf file or a package name
        from kiln.training.model.gguf import read_gguf, resolve_gguf
        from kiln.training.model.gguf_tokenizer import write_tokenizer_files

        cfg, state, meta = read_gguf(resolve_gguf(source))
        write_tokenizer_files(meta, tokenizer_dir)
        return _model_config(cfg), state
    _, cfg, state = read_hf_dir(source)
    for name in TOKENIZER_FILES:  # keep the tokenizer with the weights
        if os.path.exists(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(tokenizer_dir, name))
    return _model_config(cfg), state


def import_hf(source: str, out_dir: str, *, step: int = 0, revision: str | None = None) -> str:
    """Write `source` (an HF folder or Hub id, a .gguf file or a package shipping one) as a kiln
    checkpoint under `out_dir`, its tokenizer beside it; returns the step folder."""
    cfg, state = read_model(source, out_dir, revision)
    return write_model_checkpoint(out_dir, cfg, state, step=step)
