"""The engine's head-only-where-sampled forward equals the model's full cached forward there."""

from __future__ import annotations

import pytest
import torch

from kiln.serving.engine.forward import logits_at
from kiln.training.model.kv_cache import KVCache
from tests.serving.generate.tiny import tiny_model


@pytest.mark.parametrize("shape", ["llama", "mistral", "mixtral"])
def test_logits_at_equals_the_full_forward_and_fills_the_cache_alike(shape):
    model = tiny_model(shape, 50)
    tokens = torch.randint(0, 50, (3, 7))
    caches = [KVCache.for_model(model.cfg, 3, 32) for _ in range(2)]
    for cache in caches:  # rows already at different lengths
        cache.lengths = torch.tensor([0, 4, 9])
    rows, cols = [2, 0, 2], [6, 3, 0]
    with torch.inference_mode():
        full = model(tokens, kv_cache=caches[0])[rows, cols]
        part = logits_at(model, tokens, caches[1], rows, cols)
    torch.testing.assert_close(part, full, rtol=1e-5, atol=1e-5)
    assert caches[1].lengths.tolist() == [7, 11, 16]
    for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, strict=True):
        torch.testing.assert_close(k1, k0)
    with torch.inference_mode():  # a step nobody samples still caches its tokens
        none = logits_at(model, tokens[:, :1], caches[1], [], [])
    assert none.shape == (0, 50)
    assert caches[1].lengths.tolist() == [8, 12, 17]
