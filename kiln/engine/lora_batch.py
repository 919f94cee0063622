"""Many LoRA adapters over one base model in one forward (vLLM's multi-LoRA, punica's SGMV and
BGMV): each adapted linear layer keeps its adapters' A and B stacked in `max_loras` slots, and a
forward hook adds, to the rows of the batch that use an adapter,

    y[i] += (x[i] A[slot[i]]^T) B[slot[i]]^T        (B already scaled by alpha / r)

grouped by adapter: two matmuls per adapter present over its rows (the engine puts each
adapter's rows side by side, so they are slices; otherwise gathered with index_select and added
back with index_add_); when every row has an adapter of its own, two bmm's over weights
gathered by each row's slot instead. On CPU grouping is 2-3x faster than gathering at 16 rows
over 4-8 adapters and equal at one adapter per row (gathering copies a B per row):
bench/serving_lora.py. Rows of the base model are left untouched, bit for bit. Hooks, not a
module swap: the model's modules, names and state dict stay the base's (weight refits, quantized
layers and the plain forward keep working), and with no adapter row in a batch the hooks return
at once.

Slots are loaded on the engine thread when the scheduler admits a request (`admit`): an adapter
already in a slot is reused; otherwise a free slot, else the least recently used slot whose
adapter no running request uses, takes its weights; when every slot is busy the request waits
(the scheduler admits the requests behind it meanwhile).
Ranks below `max_rank` are zero-padded (the pad adds exact zeros).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kiln.engine.lora_adapter import LoRAAdapter
from kiln.model.lora import LINEAR_TARGETS


@dataclass
class RowSlots:
    """Which rows of this forward use which adapter slot (device tensors, built once per
    forward for every layer): `index` [n] the adapter rows, `slots` [n] their slots, `groups`
    (slot, its rows) per adapter present; `spans` (slot, first row, end) instead when each
    adapter's rows are adjacent (the engine orders a forward's rows by adapter: slices, no
    gather or scatter); `uniform` when every row uses one slot."""

    index: torch.Tensor
    slots: torch.Tensor
    groups: list[tuple[int, torch.Tensor]]
    uniform: bool
    spans: list[tuple[int, int, int]] | None = None

    @classmethod
    def of(cls, slot_of_row: list[int | None], device: torch.device) -> RowSlots | None:
        """From each row's slot (None: the base); None when no row uses an adapter."""
        picked = [(i, s) for i, s in enumerate(slot_of_row) if s is not None]
        if not picked:
            return None
        index = torch.tensor([i for i, _ in picked], device=device)
        slots = torch.tensor([s for _, s in picked], device=device)
        distinct = sorted({s for _, s in picked})
        groups = [(s, index[slots == s]) for s in distinct]
        uniform = len(distinct) == 1 and len(picked) == len(slot_of_row)
        rows_of = {s: [i for i, t in picked if t == s] for s in distinct}
        spans = [(s, r[0], r[-1] + 1) for s, r in rows_of.items()]
        adjacent = all(r[-1] - r[0] + 1 == len(r) for r in rows_of.values())
        return cls(index, slots, groups, uniform, spans if adjacent else None)

    @property
    def distinct(self) -> set[int]:
        return {s for s, _ in self.groups}


def add_lora(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: RowSlots
) -> torch.Tensor:
    """`out` [B, S, out] plus each adapter row's (x A^T) B^T, in place; a [slots, r, in],
    b [slots, out, r]."""
    if rows.uniform:  # every row, one adapter: no gathering
        s = rows.groups[0][0]
        return out.add_(F.linear(F.linear(x, a[s]), b[s]))
    if rows.spans is not None and len(rows.spans) < len(rows.index):  # adjacent rows
        for s, start, end in rows.spans:
            out[start:end].add_(F.linear(F.linear(x[start:end], a[s]), b[s]))
        return out
    if len(rows.groups) < len(rows.index):  # rows share adapters: a matmul pair per adapter
        for s, index in rows.groups:
            delta = F.linear(F.linear(x.index_select(0, index), a[s]), b[s])
            out.index_add_(0, index, delta)
        return out
    xs = x.index_select(0, rows.index)  # one adapter per row: bmm over gathered weights
    h = torch.bmm(xs, a.index_select(0, rows.slots).transpose(1, 2))  # [n, S, r]
    delta = torch.bmm(h, b.index_select(0, rows.slots).transpose(1, 2))  # [n, S, out]
    return out.index_add_(0, rows.index, delta)


class _Stack:
    """One adapted layer's slots: A [slots, r, in] and B [slots, out, r], zeros where a slot's
    adapter does not adapt this layer (`filled` says which slots do)."""

    def __init__(self, slots: int, rank: int, width_in: int, width_out: int, like: torch.Tensor):
        self.a = torch.zeros(slots, rank, width_in, dtype=like.dtype, device=like.device)
        self.b = torch.zeros(slots, width_out, rank, dtype=like.dtype, device=like.device)
        self.filled: set[int] = set()

    def load(self, slot: int, weights: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()
        self.filled.discard(slot)
        if weights is not None:
            a, b = weights
            self.a[slot, : a.shape[0]].copy_(a)
            self.b[slot, :, : b.shape[1]].copy_(b)
            self.filled.add(slot)


class LoRASlots:
    """The adapters resident in `model`'s forward: `max_loras` slots of rank up to `max_rank`."""

    def __init__(self, model: nn.Module, max_loras: int, max_rank: int) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._like = model.tok_embeddings.weight
        self._stacks: dict[str, _Stack] = {}  # allocated when an adapter first adapts the layer
        self._hooks = {}
        for name, module in model.named_modules():
            if name.rsplit(".", 1)[-1] in LINEAR_TARGETS and hasattr(module, "in_features"):
                self._hooks[name] = module.register_forward_hook(self._hook(name))
        self.slots: list[LoRAAdapter | None] = [None] * max_loras
        self._lru: OrderedDict[int, int] = OrderedDict()  # adapter uid -> slot, oldest first
        self._rows: RowSlots | None = None
        self.loads = 0  # adapters copied into a slot
        self.evictions = 0  # adapters pushed out of a slot for another
        self.mixed_forwards = 0  # forwards that ran rows of two or more adapters

    def adaptable(self) -> set[str]:
        """Names of the layers an adapter may adapt."""
        return set(self._hooks)

    # ---- the engine thread: admission ------------------------------------------------------

    def admit(self, adapter: LoRAAdapter | None, busy: Iterable[LoRAAdapter | None]) -> bool:
        """Make `adapter` resident (None: the base, always True); False when every slot holds
        an adapter that a request in `busy` (the running ones) uses."""
        if adapter is None:
            return True
        if adapter.uid in self._lru:
            self._lru.move_to_end(adapter.uid)
            return True
        slot = self._free_slot({a.uid for a in busy if a is not None})
        if slot is None:
            return False
        for name, weights in adapter.layers.items():
            if name not in self._stacks:
                a, b = weights
                self._stacks[name] = _Stack(
                    self.max_loras, self.max_rank, a.shape[1], b.shape[0], self._like
                )
        for name, stack in self._stacks.items():
            stack.load(slot, adapter.layers.get(name))
        self.slots[slot] = adapter
        self._lru[adapter.uid] = slot
        self.loads += 1
        return True

    def _free_slot(self, busy: set[int]) -> int | None:
        if None in self.slots:
            return self.slots.index(None)
        for uid, slot in self._lru.items():  # least recently used first
            if uid not in busy:
                del self._lru[uid]
                self.slots[slot] = None
                self.evictions += 1
                return slot
        return None

    def resident(self) -> list[str]:
        return [a.name for a in self.slots if a is not None]

    # ---- the engine thread: forwards -------------------------------------------------------

    @contextmanager
    def rows(self, adapters: list[LoRAAdapter | None], device: torch.device) -> Iterator[None]:
        """Inside: the model's forward adds row i's adapter `adapters[i]` (resident: admitted)."""
        rows = RowSlots.of([None if a is None else self._lru[a.uid] for a in adapters], device)
        if rows is None:
            yield
            return
        self.mixed_forwards += len(rows.groups) > 1
        self._rows = rows
        try:
            yield
        finally:
            self._rows = None

    def _hook(self, name: str):
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
            rows, stack = self._rows, self._stacks.get(name)
            if rows is None or stack is None or stack.filled.isdisjoint(rows.distinct):
                return None  # no row here uses an adapter of this layer
            return add_lora(out, args[0], stack.a, stack.b, rows)

        return hook

    def close(self) -> None:
        """Remove the hooks: the model's forward is the base's again."""
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
