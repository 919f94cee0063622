"""DeepSeek-V3's multi-token prediction layers in Hugging Face checkpoints <-> kiln's `mtp.{k}`.

DeepSeek stores MTP module k after the last decoder layer, as `model.layers.{n_layers + k}`: the
block's own weights under the usual decoder names, beside `enorm`, `hnorm`, `eh_proj`,
`shared_head.norm`, and copies of the embedding (`embed_tokens`) and output head
(`shared_head.head`), which vLLM's MTP loader reads. Kiln shares those two with the main model,
so it drops the copies on import and writes them again on export. In between, kiln's
`mtp.{k}.block.X` and `mtp.{k}.X` are spelled `layers.{n_layers + k}.X`, so the decoder's name
map, expert stacking and RoPE permutation apply to them unchanged. Every other consumer (serving,
GGUF, the other HF architectures) takes the main model alone (`without_mtp`).
"""

from __future__ import annotations

import re

import torch

from kiln.model.config import ModelConfig

StateDict = dict[str, torch.Tensor]
# the module's own weights beside its block (kiln names after `mtp.{k}.`)
OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "norm.weight")
# the copies of the embedding and output head in each MTP layer (HF names after `layers.{i}.`)
SHARED_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
_MTP = re.compile(r"^mtp\.(\d+)\.(block\.)?(.*)$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")


def mtp_as_layers(state: StateDict, cfg: ModelConfig) -> StateDict:
    """`mtp.{k}.block.X` and `mtp.{k}.X` -> `layers.{n_layers + k}.X`; other names unchanged."""
    out = {}
    for name, tensor in state.items():
        m = _MTP.match(name)
        out[f"layers.{cfg.n_layers + int(m[1])}.{m[3]}" if m else name] = tensor
    return out


def layers_as_mtp(state: StateDict, cfg: ModelConfig) -> StateDict:
    """The inverse of `mtp_as_layers`: `layers.{i}.X` with i >= n_layers -> `mtp.{i - n_layers}`."""
    out = {}
    for name, tensor in state.items():
        m = _LAYER.match(name)
        if m is None or int(m[1]) < cfg.n_layers:
            out[name] = tensor
            continue
        k, rest = int(m[1]) - cfg.n_layers, m[2]
        out[f"mtp.{k}.{rest}" if rest in OWN else f"mtp.{k}.block.{rest}"] = tensor
    return out


def hf_mtp_layer(name: str, cfg: ModelConfig) -> int | None:
    """k when an HF name belongs to DeepSeek's MTP layer k (layer n_layers + k), else None."""
    m = _HF_LAYER.match(name)
    if cfg.mla is None or m is None or int(m[1]) < cfg.n_layers:
        return None
    return int(m[1]) - cfg.n_layers


def held_mtp_depth(hf_names, cfg: ModelConfig) -> int:
    """How many of the `mtp_depth` MTP layers config.json announces the weights hold: folders
    that transformers saved announce DeepSeek's one (num_nextn_predict_layers) and hold none."""
    held = {hf_mtp_layer(name, cfg) for name in hf_names} - {None}
    depth = 0
    while depth < cfg.mtp_depth and depth in held:
        depth += 1
    return depth


def is_shared_copy(name: str) -> bool:
    """An MTP layer's copy of the embedding or output head (kiln shares the main model's)."""
    return name.split(".", 3)[-1] in SHARED_COPIES


def add_shared_copies(hf_state: StateDict, state: StateDict, cfg: ModelConfig) -> StateDict:
    """Each MTP layer's copies of the embedding and output head, as DeepSeek's checkpoints hold
    them (own storage: safetensors refuses tensors that share memory)."""
    embedding = state["tok_embeddings.weight"]
    head = embedding if cfg.tie_embeddings else state["output.weight"]
    for k in range(cfg.mtp_depth):
        for hf, tensor in zip(SHARED_COPIES, (embedding, head), strict=True):
            hf_state[f"model.layers.{cfg.n_layers + k}.{hf}"] = tensor.detach().clone()
    return hf_state


def without_mtp(cfg: ModelConfig, state: StateDict | None) -> tuple[ModelConfig, StateDict | None]:
    """The main model alone: mtp_depth 0 and no `mtp.*` weights (the modules are training-only)."""
    if not cfg.mtp_depth:
        return cfg, state
    if state is not None:
        state = {k: v for k, v in state.items() if not k.startswith("mtp.")}
    return cfg.model_copy(update={"mtp_depth": 0}), state
