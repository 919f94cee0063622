"""Activation offload moves saved activations, never weights, leaves host tensors alone, and in
backward fetches each block's tensors once, prefetching the block backward reaches next."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer
from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.parallel.activation_offload import (
    OffloadHooks,
    SyncCopier,
    apply_activation_offload,
    is_weight_cast,
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


def _offloaded_tensors(model, hooks_kwargs=None, layers=None, autocast=False):
    """How many tensors each block offloads (a copier that counts), and the model's grads."""
    count = []
    block = [None]
    for i, layer in enumerate(model.layers.values()):
        layer.register_forward_pre_hook(lambda m, a, i=i: block.__setitem__(0, i))
    copier = SyncCopier()
    to_host = copier.to_host
    copier.to_host = lambda t: count.append(block[0]) or to_host(t)
    hooks = OffloadHooks(copier_for=lambda device: copier, **(hooks_kwargs or {}))
    apply_activation_offload(model, hooks, layers=layers)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x)
    loss.float().backward()
    return count, [p.grad.clone() for p in model.parameters()]


def test_only_the_first_layers_offload_when_asked():
    counts, grads = _offloaded_tensors(_Blocks(3), {"worth": lambda t: t.dim() >= 1}, layers=2)
    assert set(counts) == {0, 1}
    reference = _grads(_Blocks(3))
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))


def test_a_tensor_saved_twice_is_offloaded_once():
    class SavesTwice(nn.Module):  # x is saved by both multiplications
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict({"0": nn.Identity()})

        def forward(self, x):
            y = self.layers["0"](x * 2)
            return (y * y).sum()  # mul saves y for both operands

    x = torch.randn(4, 8, requires_grad=True)
    counts = []
    copier = SyncCopier()
    to_host = copier.to_host
    copier.to_host = lambda t: counts.append(t.shape) or to_host(t)
    hooks = OffloadHooks(copier_for=lambda device: copier, worth=lambda t: True)
    model = SavesTwice()
    model.layers["0"] = _Square()
    apply_activation_offload(model, hooks)
    model(x).backward()
    assert len(counts) == 1  # y * y: one offloaded copy serves both saved slots
    torch.testing.assert_close(x.grad, 16 * x.detach() ** 3 * 0 + _square_grad(x.detach()))


class _Square(nn.Module):
    def forward(self, y):
        return y * y  # saves y twice (both operands)


def _square_grad(x):
    # loss = sum(((2x)^2)^2) = 16 x^4 -> d/dx = 64 x^3
    return 64 * x**3


def test_autocast_weight_casts_are_not_offloaded():
    """Under autocast the transposed bf16 cast of a Linear weight is saved for backward (where
    the Linear's input needs a gradient: the second block's); it is recast for free, so it
    stays (only activations cross to the host)."""
    model = _Blocks(2)
    counts, _ = _offloaded_tensors(
        model, {"worth": lambda t: not isinstance(t, nn.Parameter)}, autocast=True
    )
    with_casts = len(counts)
    model = _Blocks(2)
    counts, _ = _offloaded_tensors(
        model,
        {"worth": lambda t: not isinstance(t, nn.Parameter) and not is_weight_cast(t)},
        autocast=True,
    )
    assert len(counts) == with_casts - 1  # block 1's weight cast (block 0's input needs no grad)
    x = torch.randn(4, 8, requires_grad=True)  # a leaf input's cast is an activation
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not is_weight_cast(x.to(torch.bfloat16))
        assert is_weight_cast(model.layers["0"][0].weight.to(torch.bfloat16).t())
    assert is_weight_cast(model.layers["0"][0].weight.t())  # fp32: Linear saves weight.t()


def test_offload_layers_need_offload_on():
    with pytest.raises(ConfigError, match="activation_offload_layers needs activation_offload"):
        TrainConfig.model_validate({"activation_offload_layers": 2})
    cfg = TrainConfig.model_validate({"activation_offload": True, "activation_offload_layers": 2})
    assert cfg.activation_offload_layers == 2
