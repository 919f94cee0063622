"""Weights for kiln's `Transformer` from any format Kiln reads: `read_weights` dispatches on what
a path holds (a Hugging Face folder, an ExportedModel folder, a PEFT adapter folder, a Kiln
checkpoint, full or adapter-only), and `build_model` turns the result into a model.

The shape always travels as a `ModelConfig` (from the checkpoint's `kiln.json`, the HF
`config.json` or the GGUF metadata), never re-inferred from tensor shapes.
"""

from __future__ import annotations

import os
import shutil

import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.adapter_checkpoint import (
    adapter_reference,
    adapter_scaling,
    check_base,
    merge_adapters,
)
from kiln.model.formats.checkpoint import read_checkpoint, write_checkpoint
from kiln.model.formats.gguf import read_gguf, resolve_gguf
from kiln.model.formats.gguf_tokenizer import write_tokenizer_files
from kiln.model.formats.hf import read_hf_dir
from kiln.model.formats.hub import local_model
from kiln.model.formats.mtp_names import without_mtp
from kiln.model.formats.peft import is_peft_folder, read_peft_adapter
from kiln.model.meta import build_on_meta
from kiln.model.transformer import Transformer
from kiln.platform.errors import InputError
from kiln.text.tokenizer import TOKENIZER_FILES

StateDict = dict[str, torch.Tensor]


def load_weights(model: Transformer, state: StateDict) -> Transformer:
    """Copy `state` (kiln names) into `model`; every parameter must be there, nothing else."""
    tied = model.cfg.tie_embeddings
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (tied and m == "output.weight")]
    if missing or unexpected:
        raise InputError(
            f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    if tied:
        model.output.weight = model.tok_embeddings.weight
    return model


def build_model(
    cfg: ModelConfig,
    state: StateDict | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    keep_mtp: bool = False,
) -> Transformer:
    """A `Transformer` of this shape holding `state` (if given), in eval mode, attention on SDPA
    (any machine runs it; the training backend need not be installed here). Multi-token
    prediction modules are training-only: left out unless `keep_mtp` (a checkpoint's copy)."""
    if not keep_mtp:
        cfg, state = without_mtp(cfg, state)
    cfg = cfg.model_copy(update={"attention_backend": "sdpa"})
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if state is None:
        return Transformer(cfg).to(device=device, dtype=dtype).eval()
    model = build_on_meta(cfg)  # no random init of weights about to be overwritten
    model.to_empty(device=device)
    model.init_buffers(device)
    load_weights(model, state)
    return model.to(dtype=dtype).eval()


def read_weights(path: str) -> tuple[str, ModelConfig, StateDict]:
    """(resolved folder, config, state) from an HF folder, an ExportedModel folder (with `hf/`),
    a PEFT LoRA adapter folder (merged onto its base) or a kiln checkpoint (an adapter-only one
    merged onto the base it names)."""
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "hf")):
        path = os.path.join(path, "hf")
    if os.path.exists(os.path.join(path, "config.json")):
        _, cfg, state = read_hf_dir(path)
        return path, cfg, state
    if is_peft_folder(path):
        base, adapters, scaling = read_peft_adapter(path)
        _, cfg, state = read_weights(base)
        missing = {k.rsplit(".", 1)[0] + ".weight" for k in adapters} - set(state)
        if missing:
            raise InputError(f"{path}: the base {base} has no layer {sorted(missing)[0]}")
        return path, cfg, merge_adapters(state, adapters, scaling)
    cfg, state = read_checkpoint(path)
    ref = adapter_reference(path)
    if ref is None:
        return path, cfg, state
    if not os.path.exists(ref["base"]):
        raise InputError(f"{path}: its base {ref['base']} is missing (adapter-only checkpoint)")
    check_base({"adapter_only": ref}, path, ref["base"])
    _, _, base_state = read_weights(ref["base"])
    return path, cfg, merge_adapters(base_state, state, adapter_scaling(ref))


def _model_config(model_cfg) -> ModelConfig:
    return model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig(**model_cfg)


def read_model(
    source: str, tokenizer_dir: str, revision: str | None = None
) -> tuple[ModelConfig, dict]:
    """(model config, kiln-named state) of `source` (an HF folder or Hub id, a .gguf file or a
    package shipping one); its tokenizer files are written into `tokenizer_dir`."""
    source = local_model(source, revision)
    os.makedirs(tokenizer_dir, exist_ok=True)
    if not os.path.isdir(source):  # a .gguf file or a package name
        cfg, state, meta = read_gguf(resolve_gguf(source))
        write_tokenizer_files(meta, tokenizer_dir)
        return _model_config(cfg), state
    _, cfg, state = read_hf_dir(source)
    for name in TOKENIZER_FILES:  # keep the tokenizer with the weights
        if os.path.exists(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(tokenizer_dir, name))
    return _model_config(cfg), state


def write_model_checkpoint(out_dir: str, model_cfg, state: StateDict, *, step: int = 0) -> str:
    """A weights-only kiln checkpoint of (config, kiln-named state); returns the step folder."""
    model = build_model(_model_config(model_cfg), state, device="cpu", keep_mtp=True)
    return write_checkpoint(out_dir, model, step=step)


def import_model(source: str, out_dir: str, *, step: int = 0, revision: str | None = None) -> str:
    """`source` (an HF folder or Hub id, a .gguf file or a package shipping one) as a kiln
    checkpoint under `out_dir` (the checkpointer's own layout: `train` continues from it,
    `export` and `Generator.load` read it), its tokenizer files beside it; returns the step
    folder."""
    cfg, state = read_model(source, out_dir, revision)
    return write_model_checkpoint(out_dir, cfg, state, step=step)
