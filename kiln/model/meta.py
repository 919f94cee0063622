"""A model with shapes and names but no storage, for weights that come later (a checkpoint, a
Hugging Face folder, sharded materialisation)."""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer


def build_on_meta(cfg: ModelConfig) -> Transformer:
    """The full model on the meta device: `to_empty(device=...)` it, then load or init weights.

    Nothing is drawn and no RoPE table is built on meta: they would hold nothing, and torch's
    meta `normal_` and `arange` import torch._dynamo (~3.5 CPU s), which a serving replica, a
    tritonserver model or a weight conversion never needs otherwise."""
    with torch.device("meta"):
        return Transformer(cfg, init=False)
