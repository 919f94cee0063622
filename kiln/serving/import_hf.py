"""Import a Hugging Face Llama / Mistral / Mixtral directory as a kiln checkpoint.

The result is the checkpoint engineer's layout (a DCP step folder with `kiln.json`, and a
`latest` pointer), holding model weights only, so `train` can continue pretraining from it
(`init_from:`) and `export` / `Generator.load` read it like any other checkpoint.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings

from kiln.platform.errors import InputError


def write_model_checkpoint(
    out_dir: str, model_cfg: dict, state: dict, *, step: int = 0, extra: dict | None = None
) -> str:
    """A weights-only kiln checkpoint: `<out>/step-N/` (DCP + kiln.json) and `<out>/latest`."""
    import torch.distributed.checkpoint as dcp

    from kiln.training.checkpoint import storage
    from kiln.training.checkpoint.checkpointer import make_writer
    from kiln.training.model.config import ModelConfig

    model_cfg = ModelConfig(**model_cfg).model_dump(mode="json")  # validates the shape
    state = {k: v.detach().contiguous() for k, v in state.items()}
    if model_cfg["tie_embeddings"]:
        state["output.weight"] = state["tok_embeddings.weight"]
    ckpt = storage.join(out_dir, storage.step_dir_name(step))
    if os.path.exists(ckpt):
        shutil.rmtree(ckpt)
    os.makedirs(ckpt)
    with warnings.catch_warnings():  # one process, no process group: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is")
        dcp.save({"model": state}, storage_writer=make_writer(ckpt), no_dist=True)
    sidecar = {
        "format": "kiln-dcp-v1",
        "step": step,
        "tokens_seen": 0,
        "model": model_cfg,
        "layout": {"world_size": 1, "dp_size": 1, "parallel": None},
        "dataloader": None,
        **(extra or {}),
        "saved_at": time.time(),
    }
    storage.write_json(storage.join(ckpt, storage.SIDECAR), sidecar)
    storage.set_latest(out_dir, ckpt)
    if not storage.is_complete(ckpt):
        raise InputError(f"{ckpt}: writing did not produce a complete checkpoint")
    return ckpt


def import_hf(hf_dir: str, out_dir: str, *, step: int = 0) -> str:
    """Write `hf_dir`'s weights as a kiln checkpoint under `out_dir`; returns the step folder."""
    from kiln.serving.export.hf_format import read_hf_dir

    hf, cfg, state = read_hf_dir(hf_dir)
    source = {
        "path": os.path.abspath(hf_dir),
        "architecture": (hf.get("architectures") or ["?"])[0],
    }
    ckpt = write_model_checkpoint(out_dir, cfg, state, step=step, extra={"imported_from": source})
    for name in ("tokenizer.json", "tokenizer_config.json"):  # keep the tokenizer with the weights
        if os.path.exists(os.path.join(hf_dir, name)):
            shutil.copyfile(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    return ckpt
