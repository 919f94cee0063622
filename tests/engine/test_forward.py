"""The model runner's head-only-where-sampled forward (`Transformer.forward(logits_positions=)`)
equals the model's full cached forward there."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.model_runner import WIDE_HEAD, ModelRunner
from kiln.model.kv_cache import KVCache
from tests.engine.tiny import tiny_model


@pytest.mark.parametrize("shape", ["llama", "mistral", "mixtral"])
def test_runner_equals_the_full_forward_and_fills_the_cache_alike(shape):
    model = tiny_model(shape, 50)
    tokens = torch.randint(0, 50, (3, 7))
    caches = [KVCache.for_model(model.cfg, 3, 32) for _ in range(2)]
    for cache in caches:  # rows already at different lengths
        cache.lengths = torch.tensor([0, 4, 9])
    rows, cols = [2, 0, 2], [6, 3, 0]
    with torch.inference_mode():
        full = model(tokens, kv_cache=caches[0])[rows, cols]
        part = ModelRunner(model)(tokens, caches[1], rows, cols)
    torch.testing.assert_close(part, full, rtol=1e-5, atol=1e-5)
    assert caches[1].lengths.tolist() == [7, 11, 16]
    for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, strict=True):
        torch.testing.assert_close(k1, k0)
    with torch.inference_mode():  # a step nobody samples still caches its tokens
        none = ModelRunner(model)(tokens[:, :1], caches[1], [], [])
    assert none.shape == (0, 50)
    assert caches[1].lengths.tolist() == [8, 12, 17]


@pytest.mark.parametrize(
    "shape,overrides",
    [
        ("llama", {}),
        ("mistral", {}),
        ("mixtral", {}),
        ("llama", {"qkv_bias": True}),
        ("mistral", {"vocab_size": WIDE_HEAD}),  # an untied head wide enough to go column-major
    ],
)
def test_runner_equals_the_models_forward(shape, overrides):
    vocab = overrides.pop("vocab_size", 50)
    model = tiny_model(shape, vocab, **overrides)
    if overrides.get("qkv_bias"):
        with torch.no_grad():
            for block in model.layers.values():
                for lin in (block.attention.wq, block.attention.wk, block.attention.wv):
                    lin.bias.normal_()
    tokens = torch.randint(0, vocab, (3, 7))
    caches = [KVCache.for_model(model.cfg, 3, 32) for _ in range(2)]
    for cache in caches:
        cache.lengths = torch.tensor([0, 4, 9])
    rows, cols = [2, 0, 1], [6, 3, 0]
    with torch.inference_mode():
        full = model(tokens, kv_cache=caches[0])[rows, cols]
        part = ModelRunner(model)(tokens, caches[1], rows, cols)
    torch.testing.assert_close(part, full, rtol=1e-5, atol=1e-5)
    assert caches[1].lengths.tolist() == [7, 11, 16]
    for k0, k1 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, strict=True):
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
    head = model.output.weight
    assert head.is_contiguous() == (vocab < WIDE_HEAD)  # the wide one is stored column-major
    with torch.inference_mode():  # and the model's own forward gives what it gave before
        fresh = KVCache.for_model(model.cfg, 3, 32)
        fresh.lengths = torch.tensor([0, 4, 9])
        torch.testing.assert_close(model(tokens, kv_cache=fresh)[rows, cols], full)


def test_another_layout_runs_the_models_own_modules():
    model = tiny_model("llama", 50)
    model.layers["1"].attention.wq = torch.nn.Sequential(model.layers["1"].attention.wq)
    forward = ModelRunner(model)
    tokens = torch.randint(0, 50, (1, 5))
    with torch.inference_mode():
        a = forward(tokens, KVCache.for_model(model.cfg, 1, 16), [0], [4])
        b = model(tokens, kv_cache=KVCache.for_model(model.cfg, 1, 16))[:, 4]
    torch.testing.assert_close(a, b)
