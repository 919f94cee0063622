"""Activation offload: tensors each transformer block saves for backward live in host memory
between its forward and its backward.

On CUDA the copies run on side streams: a block's saved tensors go to pinned host memory on a
device-to-host stream (after the compute that produced them, which does not wait for the copy),
and in backward, when a block's first saved tensor is needed, the block before it (the next one
backward reaches) is fetched on a host-to-device stream while this block computes; the compute
stream waits for a fetch only when it uses that tensor. Elsewhere the copies are synchronous,
and on CPU nothing is offloaded (`worth_offloading`). Weights are never offloaded.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def worth_offloading(tensor: torch.Tensor) -> bool:
    """Saved activations on an accelerator; not parameters nor views and casts of them (they
    stay resident, or are recast for free: an offloaded copy only costs PCIe time and host
    memory), and not tensors already on the host."""
    return (
        not isinstance(tensor, nn.Parameter)
        and tensor.device.type != "cpu"
        and not is_weight_cast(tensor)
    )


# Autograd nodes that only view or cast their one input: a saved tensor reached from a parameter
# through these alone (Linear saves `weight.t()`, autocast its bf16 copy) is the weight again.
_VIEW_OR_CAST = {
    "ToCopyBackward0",
    "TBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "ViewBackward0",
    "UnsafeViewBackward0",
    "ReshapeAliasBackward0",
    "ExpandBackward0",
    "UnsqueezeBackward0",
    "SqueezeBackward0",
    "SqueezeBackward1",
    "SliceBackward0",
    "SelectBackward0",
    "AsStridedBackward0",
}


def is_weight_cast(tensor: torch.Tensor, depth: int = 4) -> bool:
    """A view or dtype cast of a parameter (e.g. autocast's transposed bf16 weight)."""
    fn = tensor.grad_fn
    for _ in range(depth):
        if fn is None or fn.name() not in _VIEW_OR_CAST:
            return False
        inputs = [nxt for nxt, _ in fn.next_functions if nxt is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
        if type(fn).__name__ == "AccumulateGrad":
            return isinstance(fn.variable, nn.Parameter)
    return False


def _alias_key(tensor: torch.Tensor) -> tuple:
    """Tensors with this key are the same memory seen the same way: offloaded once."""
    try:
        storage = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (fake tensors): only itself
        return (id(tensor),)
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)


def _host_like(tensor: torch.Tensor, pin_memory: bool) -> torch.Tensor:
    """A host buffer with the tensor's strides: a compiled block's backward asserts the strides
    of what it saved (a transposed q/k/v view comes back transposed, not contiguous)."""
    return torch.empty_like(tensor, device="cpu", pin_memory=pin_memory)


class SyncCopier:
    """Plain copies (accelerators without streams); `ready` has nothing to wait for."""

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory

    def to_host(self, tensor: torch.Tensor) -> Any:
        host = _host_like(tensor, self.pin_memory)
        host.copy_(tensor, non_blocking=self.pin_memory)
        return host

    def to_device(self, handle: Any, device: torch.device) -> Any:
        return handle.to(device, non_blocking=self.pin_memory)

    def ready(self, fetched: Any) -> torch.Tensor:
        return fetched


class StreamCopier:
    """CUDA copies on a device-to-host and a host-to-device side stream, ordered by events."""

    def __init__(self, device: torch.device):
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)

    def to_host(self, tensor: torch.Tensor) -> Any:
        host = _host_like(tensor, pin_memory=True)
        self.d2h.wait_stream(torch.cuda.current_stream(tensor.device))  # after its producer
        with torch.cuda.stream(self.d2h):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(self.d2h)  # the allocator keeps it until the copy has read it
        copied = torch.cuda.Event()
        copied.record(self.d2h)
        return host, copied

    def to_device(self, handle: Any, device: torch.device) -> Any:
        host, copied = handle
        self.h2d.wait_event(copied)
        with torch.cuda.stream(self.h2d):
            tensor = host.to(device, non_blocking=True)
        fetched = torch.cuda.Event()
        fetched.record(self.h2d)
        return tensor, fetched

    def ready(self, fetched: Any) -> torch.Tensor:
        tensor, event = fetched
        compute = torch.cuda.current_stream(tensor.device)
        compute.wait_event(event)
        tensor.record_stream(compute)  # allocated on h2d, used (and freed) on compute
        return tensor


def default_copier(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_available():
        return StreamCopier(device)
    return SyncCopier(pin_memory=torch.cuda.is_available())


class _Group:
    """The tensors one block's forward offloaded (one micro-batch); fetched together."""

    def __init__(self, previous: weakref.ref | None):
        # weak: the autograd graph owns the entries (and through them the group), so an
        # offloaded copy goes when the graph does, with no reference cycle to wait for the GC
        self.entries: list[weakref.ref] = []
        self.aliases: dict[tuple, weakref.ref] = {}  # _alias_key -> the entry already made
        self.previous = previous  # the block forwarded before this one: backward's next
        self.fetched = False


class _Entry:
    def __init__(self, group: _Group, device: torch.device, handle: Any):
        self.group, self.device, self.handle = group, device, handle
        self.fetched: Any = None
        self.uses = 1  # saved-tensor slots holding this entry (an alias adds one)


class OffloadHooks:
    """Saved-tensor hooks around each block's forward (reentrant-safe per thread), with
    prefetch of the previous block's group in backward. `copier_for(device)` makes the copier;
    `worth(tensor)` says what to offload (tests substitute both to follow the order on CPU)."""

    def __init__(
        self,
        copier_for: Callable[[torch.device], Any] = default_copier,
        worth: Callable[[torch.Tensor], bool] = worth_offloading,
    ):
        self.copier_for, self.worth = copier_for, worth
        self.copiers: dict[torch.device, Any] = {}
        self.stack: dict[int, list] = defaultdict(list)
        self.local = threading.local()  # .groups: the running forwards' groups (innermost last)
        self.last: weakref.ref | None = None  # the group of the last block forward

    def _copier(self, device: torch.device):
        if device not in self.copiers:
            self.copiers[device] = self.copier_for(device)
        return self.copiers[device]

    def pack(self, tensor: torch.Tensor):
        groups = getattr(self.local, "groups", None)
        group = groups[-1] if groups else None
        if group is None or not self.worth(tensor):
            return tensor
        key = _alias_key(tensor)
        known = group.aliases.get(key)
        entry = known() if known is not None else None
        if entry is not None:  # saved again (by another op of the block): one copy serves both
            entry.uses += 1
            return entry
        entry = _Entry(group, tensor.device, self._copier(tensor.device).to_host(tensor))
        group.entries.append(weakref.ref(entry))
        group.aliases[key] = weakref.ref(entry)
        return entry

    def unpack(self, packed):
        if not isinstance(packed, _Entry):
            return packed
        group = packed.group
        if not group.fetched:
            self._fetch(group)
        previous = group.previous() if group.previous is not None else None
        if previous is not None and not previous.fetched:
            self._fetch(previous)  # overlaps with this block's backward
        if packed.fetched is None:  # unpacked again (a retained graph): fetch it anew
            packed.fetched = self._copier(packed.device).to_device(packed.handle, packed.device)
        packed.uses -= 1
        fetched = packed.fetched
        if packed.uses <= 0:
            packed.fetched = None  # the device copy is autograd's now
        return self._copier(packed.device).ready(fetched)

    def _fetch(self, group: _Group) -> None:
        group.fetched = True
        for ref in group.entries:
            entry = ref()
            if entry is not None and entry.fetched is None:
                entry.fetched = self._copier(entry.device).to_device(entry.handle, entry.device)

    def pre(self, module, args):
        group = _Group(self.last)
        self.last = weakref.ref(group)
        if not hasattr(self.local, "groups"):
            self.local.groups = []
        self.local.groups.append(group)
        ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        ctx.__enter__()
        self.stack[id(module)].append(ctx)

    def post(self, module, args, output):
        self.stack[id(module)].pop().__exit__(None, None, None)
        self.local.groups.pop()


def apply_activation_offload(
    model: nn.Module, hooks: OffloadHooks | None = None, layers: int | None = None
) -> OffloadHooks:
    """Tensors saved for backward inside each block (not its weights) live in host memory
    until the backward pass; returns the hooks (tests follow them). `layers`: only the first
    that many blocks (their activations wait longest for backward; the last blocks' are used
    almost at once, so offloading them buys little memory for the same PCIe time)."""
    hooks = hooks or OffloadHooks()
    blocks = list(model.layers.values())
    for block in blocks if layers is None else blocks[:layers]:
        block.register_forward_pre_hook(hooks.pre)
        block.register_forward_hook(hooks.post)
    return hooks
