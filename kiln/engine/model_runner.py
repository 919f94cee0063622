"""The engine's model runner: one `Transformer.forward` over the KV cache per prefill chunk or
decode step, with logits only where a token is sampled (`logits_positions`)."""

from __future__ import annotations

import torch
from torch import nn

from kiln.model.attention import AttentionCore
from kiln.model.kv_cache import KVCache
from kiln.model.packed_batch import paged_attention_takes
from kiln.model.paged_kv_cache import PagedBatch, PagedKVCache

WIDE_HEAD = 16384  # vocabularies from here on get the column-major head


def column_major_head(model: nn.Module) -> None:
    """Store a wide, untied LM head column-major (same values, same tensor size): F.linear then
    multiplies by a contiguous [D, V] matrix, which MKL runs faster than the transposed one at
    1-64 rows (bench/serving_engine.py --part steps). A tied head keeps its layout (the
    embedding gathers rows of it)."""
    head = getattr(model, "output", None)
    embeddings = getattr(model, "tok_embeddings", None)
    if type(head) is not nn.Linear or embeddings is None:  # a laid-out head keeps its layout
        return
    if head.weight is embeddings.weight or head.weight.shape[0] < WIDE_HEAD:
        return
    if head.weight.stride(0) == 1:  # already stored so
        return
    head.weight.data = head.weight.detach().t().contiguous().t()


def decodes_in_place(model: nn.Module, cache: PagedKVCache) -> bool:
    """Whether `model`'s packed forwards over `cache` read decoding rows' keys and values in
    place through the paged attention op (PackedBatch's `in_place`). The op computes plain
    softmax(q k^T) v, so the model's attention is checked first: a model with none of that
    (the batch-invariant cores of the RL rollouts, soft-capped scores, MLA's latent) never
    builds the op. Otherwise the op is built (or loaded from its cache) now, so the first
    request does not wait for a compiler."""
    if getattr(getattr(model, "cfg", None), "mla", None) is not None:
        return False
    cores = (m for m in model.modules() if isinstance(m, AttentionCore))
    if not any(core.takes_additive_mask for core in cores):
        return False
    return paged_attention_takes(cache)


class ModelRunner:
    """Runs `model` (a kiln `Transformer`) for the engine's scheduled work."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        column_major_head(model)

    def __call__(
        self,
        tokens: torch.Tensor,
        cache: KVCache | PagedBatch,
        rows: list[int],
        cols: list[int],
    ) -> torch.Tensor:
        """`model(tokens, kv_cache=cache)[rows, cols]`: logits [len(rows), V] of those
        positions; every token's keys/values are cached and the rows advance."""
        device = tokens.device
        index = (
            torch.tensor(rows, dtype=torch.long, device=device),
            torch.tensor(cols, dtype=torch.long, device=device),
        )
        return self.model(tokens, kv_cache=cache, logits_positions=index)
