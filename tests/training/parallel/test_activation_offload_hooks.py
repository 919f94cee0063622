"""Activation offload moves saved activations, never weights, leaves host tensors alone, and in
backward fetches each block's tensors once, prefetching the block backward reaches next."""

from __future__ import annotations

import torch
from torch import nn

from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer
from kiln.training.parallel.activation_offload import (
    OffloadHooks,
    SyncCopier,
    apply_activation_offload,
    worth_offloading,
)
from kiln.training.parallel.parallelize import _apply_compile


def test_weights_and_host_tensors_are_not_offloaded():
    assert not worth_offloading(nn.Parameter(torch.zeros(2)))
    assert not worth_offloading(torch.zeros(2))
    assert worth_offloading(torch.zeros(2, device="meta"))


class _Blocks(nn.Module):
    def __init__(self, n: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleDict(
            {str(i): nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for i in range(n)}
        )

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x.pow(2).sum()


def _grads(model: _Blocks) -> list[torch.Tensor]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    model(x).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_cpu_path_offloads_nothing():
    model = _Blocks()
    hooks = apply_activation_offload(model)
    _grads(model)
    assert hooks.copiers == {}  # CPU tensors are not worth offloading: no copier was made


class _Recorder:
    """A copier that logs (event, block) and copies on the host."""

    def __init__(self, log, block):
        self.log, self.block = log, block

    def to_host(self, tensor):
        self.log.append(("offload", self.block[0]))
        return self.block[0], tensor.clone()

    def to_device(self, handle, device):
        self.log.append(("fetch", handle[0]))
        return handle

    def ready(self, fetched):
        self.log.append(("use", fetched[0]))
        return fetched[1]


def test_backward_fetches_each_block_once_and_prefetches_the_next():
    model = _Blocks(3)
    reference = _grads(model)
    log, block = [], [None]
    for i, layer in enumerate(model.layers.values()):
        layer.register_forward_pre_hook(lambda m, a, i=i: block.__setitem__(0, i))
    hooks = OffloadHooks(
        copier_for=lambda device: _Recorder(log, block),
        worth=lambda t: not isinstance(t, nn.Parameter),
    )
    apply_activation_offload(model, hooks)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), reference, strict=True))

    offloads = [b for e, b in log if e == "offload"]
    fetches = [b for e, b in log if e == "fetch"]
    assert offloads and sorted(fetches) == sorted(offloads)  # each saved tensor fetched once
    backward = log[len(offloads) :]
    assert all(e != "offload" for e, _ in backward)

    def first(event, b):
        return backward.index((event, b))

    # backward reaches block 2 first: it is fetched, then block 1 (prefetch) before any use
    assert first("fetch", 2) < first("fetch", 1) < first("use", 2)
    # block 0 is prefetched once block 1's backward starts, before block 1's tensors are used
    assert first("use", 2) < first("fetch", 0) < first("use", 1)
    # every block's tensors were on the device before its first use
    for b in range(3):
        last_fetch = max(i for i, x in enumerate(backward) if x == ("fetch", b))
        assert last_fetch < first("use", b)


def test_compiled_blocks_offload_through_the_hooks_with_strides_kept():
    """The GPU gate's `1b_activation_offload` row (compile on) failed inside dynamo, which traced
    the hooks. The trainer's compile with offload: blocks compile their forward only, the hooks
    run eagerly, every tensor the compiled graph saves goes through them, and the host copies
    keep their strides (the compiled backward asserts them; attention saves transposed views)."""
    cfg = ModelConfig(vocab_size=128, dim=32, n_layers=2, n_heads=4, max_seq_len=16)
    torch.manual_seed(0)
    eager = Transformer(cfg)
    offloaded = Transformer(cfg)
    offloaded.load_state_dict(eager.state_dict())
    copier = SyncCopier()
    saved = []  # (contiguous?, device strides, host strides) of every offloaded tensor
    to_host = copier.to_host

    def record(tensor):
        host = to_host(tensor)
        saved.append((tensor.is_contiguous(), tensor.stride(), host.stride()))
        return host

    copier.to_host = record
    hooks = OffloadHooks(copier_for=lambda device: copier, worth=lambda t: t.dim() >= 2)
    apply_activation_offload(offloaded, hooks)
    _apply_compile(offloaded, hooks_outside=True)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12))
    for model in (eager, offloaded):
        model(tokens).float().square().mean().backward()
    assert len(saved) > 10
    assert all(device == host for _, device, host in saved)
    assert not all(contiguous for contiguous, _, _ in saved)  # the case that needs the strides
    for (name, a), b in zip(eager.named_parameters(), offloaded.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
