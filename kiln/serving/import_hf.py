"""Import a Hugging Face Llama / Mistral / Mixtral directory as a kiln checkpoint.

The result is the checkpoint engineer's layout (a DCP step folder with `kiln.json`, and a
`latest` pointer), holding model weights only, so `train` can continue pretraining from it
(`init_from:`) and `export` / `Generator.load` read it like any other checkpoint.
"""

from __future__ import annotations

import os
import shutil
import time

from kiln.platform.errors import InputError


def import_hf(hf_dir: str, out_dir: str, *, step: int = 0) -> str:
    """Write `hf_dir`'s weights as a kiln checkpoint under `out_dir`; returns the step folder."""
    import torch.distributed.checkpoint as dcp

    from kiln.serving.export.hf_format import read_hf_dir
    from kiln.training.checkpoint import storage
    from kiln.training.checkpoint.checkpointer import make_writer
    from kiln.training.model.config import ModelConfig

    hf, cfg, state = read_hf_dir(hf_dir)
    model_cfg = ModelConfig(**cfg).model_dump(mode="json")  # validates the shape
    if model_cfg["tie_embeddings"]:
        state["output.weight"] = state["tok_embeddings.weight"]
    state = {k: v.contiguous() for k, v in state.items()}
    ckpt = storage.join(out_dir, storage.step_dir_name(step))
    if os.path.exists(ckpt):
        shutil.rmtree(ckpt)
    os.makedirs(ckpt)
    dcp.save({"model": state}, storage_writer=make_writer(ckpt), no_dist=True)
    sidecar = {
        "format": "kiln-dcp-v1",
        "step": step,
        "tokens_seen": 0,
        "model": model_cfg,
        "layout": {"world_size": 1, "dp_size": 1, "parallel": None},
        "dataloader": None,
        "imported_from": {"path": os.path.abspath(hf_dir), "architecture": (hf.get("architectures") or ["?"])[0]},
        "saved_at": time.time(),
    }
    storage.write_json(storage.join(ckpt, storage.SIDECAR), sidecar)
    storage.set_latest(out_dir, ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # keep the tokenizer with the weights
        if os.path.exists(os.path.join(hf_dir, name)):
            shutil.copyfile(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    if not storage.is_complete(ckpt):
        raise InputError(f"{ckpt}: import did not produce a complete checkpoint")
    return ckpt
