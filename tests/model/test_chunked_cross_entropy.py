"""Chunked head + cross entropy: the plain path's loss and gradients without the full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.model import ModelConfig, Transformer
from kiln.model.chunked_cross_entropy import linear_cross_entropy
from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.post.config import PostTrainConfig


def plain_loss(hidden, weight, labels, softcap=None):
    logits = F.linear(hidden, weight)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


@pytest.mark.parametrize("softcap", [None, 5.0])
@pytest.mark.parametrize("chunk", [1, 8, 64, 1000])
def test_loss_and_grads_equal_the_plain_path(chunk, softcap):
    torch.manual_seed(0)
    hidden = torch.randn(2, 37, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 37))
    labels[0, 3] = labels[1, :5] = -100
    ref = plain_loss(hidden, weight, labels, softcap)
    ref_grads = torch.autograd.grad(ref * 3, (hidden, weight))
    loss = linear_cross_entropy(hidden, weight, labels, chunk, softcap)
    grads = torch.autograd.grad(loss * 3, (hidden, weight))
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=0)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_under_autocast_it_follows_the_plain_bf16_head():
    torch.manual_seed(0)
    hidden = torch.randn(64, 32, requires_grad=True)
    weight = torch.randn(100, 32, requires_grad=True)
    labels = torch.randint(0, 100, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain_loss(hidden[None], weight, labels[None])
        loss = linear_cross_entropy(hidden, weight, labels, 16)
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=0)
    grad = torch.autograd.grad(loss, weight)[0]
    ref_grad = torch.autograd.grad(ref, weight)[0]
    assert grad.dtype == torch.float32  # the fp32 master weight gets an fp32 gradient
    torch.testing.assert_close(grad, ref_grad, atol=2e-3, rtol=2e-2)


def largest_saved_numel(fn) -> int:
    """The element count of the largest tensor autograd saves for backward while fn runs."""
    sizes = [0]

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_model_loss_equals_logits_loss_and_keeps_no_logits():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=512, final_logit_softcap=30.0)
    model = Transformer(cfg)
    tokens = torch.randint(0, 512, (4, 64))
    labels = torch.randint(0, 512, (4, 64))

    def logits_loss():
        return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())

    ref = logits_loss()
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    loss = model(tokens, labels=labels, loss_chunk_tokens=32)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=0)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    n_logits = tokens.numel() * cfg.vocab_size
    assert largest_saved_numel(logits_loss) >= n_logits
    chunked = largest_saved_numel(lambda: model(tokens, labels=labels, loss_chunk_tokens=32))
    assert chunked == cfg.vocab_size * cfg.dim  # the output weight is the largest thing kept


@pytest.mark.parametrize("parallel,cls", [({"pp": 2}, TrainConfig), ({}, PostTrainConfig)])
def test_layouts_without_a_chunked_path_are_refused(parallel, cls):
    with pytest.raises(ConfigError, match="loss_chunk_tokens"):
        cls(model={"preset": "tiny"}, parallel=parallel, loss_chunk_tokens=256)
