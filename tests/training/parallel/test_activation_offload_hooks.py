"""Activation offload moves saved activations, never weights, and leaves host tensors alone."""

from __future__ import annotations

import torch
from torch import nn

from kiln.training.parallel.activation_checkpoint import _OffloadHooks, worth_offloading


def test_weights_and_host_tensors_are_not_offloaded():
    assert not worth_offloading(nn.Parameter(torch.zeros(2)))
    assert not worth_offloading(torch.zeros(2))
    assert worth_offloading(torch.zeros(2, device="meta"))


def test_packing_keeps_the_saved_tensors_themselves_on_the_host():
    """On CPU nothing is copied (torch's save_on_cpu copied every saved tensor, weights too)."""
    hooks = _OffloadHooks(pin_memory=False)
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    pairs = []

    def pack(t):
        pairs.append((t, hooks.pack(t)))
        return pairs[-1][1]

    with torch.autograd.graph.saved_tensors_hooks(pack, hooks.unpack):
        y = lin(x).relu().sum()
    y.backward()
    assert pairs and all(packed is saved for saved, packed in pairs)
    assert x.grad is not None and lin.weight.grad is not None
