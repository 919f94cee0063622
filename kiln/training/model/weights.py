"""Weight I/O for kiln's `Transformer`: read weights from a kiln checkpoint, a Hugging Face folder
or a GGUF file, build a model from them, and write a weights-only kiln checkpoint.

The shape always travels as a `ModelConfig` (from the checkpoint's `kiln.json`, the HF
`config.json` or the GGUF metadata), never re-inferred from tensor shapes.
"""

from __future__ import annotations

import json
import os
import warnings

import torch

from kiln.platform.errors import InputError
from kiln.training.model.config import ModelConfig
from kiln.training.model.hf_names import from_hf_config, from_hf_state
from kiln.training.model.meta import build_on_meta
from kiln.training.model.transformer import Transformer

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
) -> Transformer:
    """A `Transformer` of this shape holding `state` (if given), in eval mode, attention on SDPA
    (any machine runs it; the training backend need not be installed here)."""
    cfg = cfg.model_copy(update={"attention_backend": "sdpa"})
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if state is None:
        return Transformer(cfg).to(device=device, dtype=dtype).eval()
    model = build_on_meta(cfg)  # no random init of weights about to be overwritten
    model.to_empty(device=device)
    model.init_buffers(device)
    load_weights(model, state)
    return model.to(dtype=dtype).eval()


def read_checkpoint(path: str) -> tuple[ModelConfig, StateDict]:
    """Model config and full state dict of a kiln checkpoint (a step folder, or a root with
    `latest`), in one process (DCP reshards whatever layout wrote it)."""
    from kiln.training.checkpoint.offline import load_model_state

    with warnings.catch_warnings():  # one process, no process group: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is")
        cfg, state = load_model_state(path)
    from kiln.training.post.adapter_checkpoint import merge_adapter_checkpoint

    state = merge_adapter_checkpoint(path, state)  # adapter-only LoRA: merged onto its base
    if not cfg:
        raise InputError(f"{path}: the checkpoint's kiln.json has no model config")
    return ModelConfig(**cfg), state


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
    return hf, cfg, from_hf_state(state, cfg)


def read_weights(path: str) -> tuple[str, ModelConfig, StateDict]:
    """(resolved folder, config, state) from an HF folder, an ExportedModel folder (with `hf/`)
    or a kiln checkpoint."""
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "hf")):
        path = os.path.join(path, "hf")
    if os.path.exists(os.path.join(path, "config.json")):
        _, cfg, state = read_hf_dir(path)
        return path, cfg, state
    if os.path.exists(os.path.join(path, "adapter_config.json")):  # PEFT LoRA: merged onto base
        from kiln.training.post.lora_export import read_peft_adapter

        return (path, *read_peft_adapter(path))
    return (path, *read_checkpoint(path))


def write_checkpoint(out_dir: str, model: Transformer, *, step: int = 0) -> str:
    """A weights-only kiln checkpoint of `model`: `<out>/step-N/` (DCP + kiln.json) and
    `<out>/latest`, written by the checkpointer itself, so `train` (`init_from:`), `export` and
    `Generator.load` read it like any other. Returns the step folder."""
    from kiln.training.checkpoint.checkpointer import Checkpointer
    from kiln.training.checkpoint.config import CheckpointConfig
    from kiln.training.checkpoint.storage import is_complete
    from kiln.training.train_state import TrainState

    checkpointer = Checkpointer(
        CheckpointConfig(dir=out_dir),
        model_parts=[model],
        optimizers=[],
        train_state=TrainState(step=step),
        model_config=model.cfg.model_dump(mode="json"),
    )
    with warnings.catch_warnings():  # one process, no process group: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is")
        checkpointer.save(step, force=True)
        checkpointer.close()
    _, ckpt = checkpointer.committed
    if not is_complete(ckpt):
        raise InputError(f"{ckpt}: writing did not produce a complete checkpoint")
    return ckpt
