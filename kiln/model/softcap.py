"""Logit soft-capping (Gemma 2): cap * tanh(x / cap) bounds logits smoothly to (-cap, cap)."""

from __future__ import annotations

import torch


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap
