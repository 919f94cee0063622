"""DeepSeek's interleaved RoPE dims <-> kiln's rotate_half halves, by permuting weight rows.

DeepSeek checkpoints (HF `rope_interleave: true`) rotate RoPE dims in pairs (x0, x1), (x2, x3),
...; kiln (and HF Llama) rotate the first half against the second. Reordering the rows that
produce RoPE dims to evens-then-odds turns one into the other exactly (the rotated q and k hold
the same numbers, so q.k does too): the rope rows of each head of the q projection, and the
RoPE-key rows after the latent in `wkv_a`. Import de-interleaves, export interleaves again, so
HF -> kiln -> HF gives back the same bytes.
"""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig

StateDict = dict[str, torch.Tensor]


def _rows(cfg: ModelConfig, name: str) -> torch.Tensor | None:
    """Indices of the RoPE rows of an MLA weight (None for any other weight)."""
    mla = cfg.mla
    rope = torch.arange(mla.qk_rope_head_dim)
    if name.endswith(("attention.wq.weight", "attention.wq_b.weight")):
        starts = torch.arange(cfg.n_heads) * mla.qk_head_dim + mla.qk_nope_head_dim
        return (starts[:, None] + rope[None, :]).reshape(-1)
    if name.endswith("attention.wkv_a.weight"):
        return mla.kv_lora_rank + rope
    return None


def _permute(state: StateDict, cfg: ModelConfig, inverse: bool) -> StateDict:
    if cfg.mla is None or not cfg.mla.rope_interleave:
        return state
    n = cfg.mla.qk_rope_head_dim
    order = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])  # evens, then odds
    if inverse:
        order = torch.argsort(order)
    out = dict(state)
    for name, tensor in state.items():
        rows = _rows(cfg, name)
        if rows is None:
            continue
        per_block = rows.view(-1, n)
        tensor = tensor.clone()
        tensor[per_block.reshape(-1)] = tensor[per_block[:, order].reshape(-1)]
        out[name] = tensor
    return out


def from_interleaved_rope(state: StateDict, cfg: ModelConfig) -> StateDict:
    """Kiln-named weights read from an interleaved checkpoint -> kiln's rotate_half layout."""
    return _permute(state, cfg, inverse=False)


def to_interleaved_rope(state: StateDict, cfg: ModelConfig) -> StateDict:
    """Kiln's layout -> the checkpoint's interleaved layout (before renaming to HF)."""
    return _permute(state, cfg, inverse=True)
