"""The model's cached forward with the LM head only where a token is sampled.

`Transformer.forward` returns logits for every position; a prefill chunk needs them at its last
prompt position only, and a decode step only for the rows that decode (not the idle slots the
[slots, 1] step carries). On a 125M-shaped model with a 32k vocabulary the head is ~20% of a
token's FLOPs, so a 32-token prompt chunk spent most of its head work on logits nobody read
(transformers' generate keeps one position too: `logits_to_keep=1`).
"""

from __future__ import annotations

import torch
from torch import nn

from kiln.training.model.kv_cache import KVCache


def logits_at(
    model: nn.Module,
    tokens: torch.Tensor,
    cache: KVCache,
    rows: list[int],
    cols: list[int],
) -> torch.Tensor:
    """`model(tokens, kv_cache=cache)[rows, cols]` ([len(rows), V]) without computing the
    other positions' logits. The trunk is `Transformer.forward`'s own loop; a model without
    that layout (no `layers`/`norm`/`output`) runs its whole forward instead."""
    parts = ("tok_embeddings", "layers", "norm", "output", "rope_cos", "rope_sin")
    if not all(getattr(model, p, None) is not None for p in parts):
        return model(tokens, kv_cache=cache)[rows, cols]
    h = model.tok_embeddings(tokens)
    seq_len = h.shape[1]
    positions = cache.positions(seq_len)
    cache.begin(seq_len)
    for layer in model.layers.values():
        h = layer(h, model.rope_cos, model.rope_sin, positions=positions, kv_cache=cache)
    cache.advance(seq_len)
    index = tuple(torch.tensor(i, dtype=torch.long, device=h.device) for i in (rows, cols))
    return model.output(model.norm(h[index]))
