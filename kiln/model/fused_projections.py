"""Fused input projections (`model.fused_projections`): attention's q/k/v as one `wqkv` Linear and
the gated FFN's gate/up as one `w13` Linear, so a block's input side runs 2 GEMMs instead of 5.

Fused in memory only. State dicts keep the unfused names (`wq`/`wk`/`wv`, `w1`/`w3`): the module
splits its fused weight into row blocks on the way out (`state_dict`) and joins them on the way
in (`load_state_dict`), so checkpoints, Hugging Face and GGUF files and every name map stay as
they are, and a checkpoint saved fused loads unfused and the reverse. `split_entries` and
`join_entries` do the same for any per-parameter dict (the optimizer's flattened state).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

SUFFIXES = ("weight", "bias")


@dataclass(frozen=True)
class Fusion:
    """One fused Linear `fused` whose output rows are the parts' rows, in order. `order`: the
    unfused module's children in declaration order, when another child sat between the parts
    (FeedForward's w1, w2, w3), so the state dict lists them as the unfused module's does."""

    fused: str
    parts: tuple[str, ...]
    sizes: tuple[int, ...]
    order: tuple[str, ...] = ()


def fuse(module: nn.Module, fusion: Fusion) -> None:
    """Give `module` (holding the Linear `fusion.fused`) state dicts under the parts' names."""
    module.fusion = fusion

    def split(module, state, prefix, local_metadata):
        split_entries(state, fusion, [f"{prefix}{{}}.{suffix}" for suffix in SUFFIXES])
        if fusion.order:
            _reorder(state, prefix, fusion.order)

    def join(module, state, prefix, *args):
        linear = getattr(module, fusion.fused)
        for suffix in SUFFIXES:
            join_entries(state, fusion, f"{prefix}{{}}.{suffix}", getattr(linear, suffix))

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


def fused_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Name (wrapper prefixes dropped, as state dicts drop them) -> module, of every module in
    `model` that holds a fused Linear (its `fusion` says which)."""
    out = {}
    for name, module in model.named_modules():
        if getattr(module, "fusion", None) is not None:
            clean = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
            out[clean] = module
    return out


def model_state_dict(model: nn.Module) -> dict:
    """torch's `get_model_state_dict` (DCP's view: wrapper prefixes dropped, shards as DTensors),
    also for a model with fused modules. The helper resolves every key to a module attribute,
    and the unfused names a fused module's hooks give (wq of wqkv) are none: such a model gives
    its own state dict, which for FSDP2, TP or plain parameters is what the helper returns."""
    return model.state_dict() if fused_modules(model) else get_model_state_dict(model)


def load_model_state_dict(model: nn.Module, state: dict) -> None:
    """torch's `set_model_state_dict`, also for a model with fused modules (strict)."""
    if fused_modules(model):
        model.load_state_dict(state)
    else:
        set_model_state_dict(model, state)


def _pieces(value, sizes: tuple[int, ...]) -> list:
    """Row blocks of a tensor; anything else (Adam's scalar step, a group's lr) for every part."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return list(value.split(list(sizes), dim=0))
    return [value] * len(sizes)


def _replace(state: dict, old: set[str], new: dict) -> None:
    """Put `new`'s entries where the first key of `old` was, and drop `old`'s, in place."""
    items = list(state.items())
    first = next(k for k, _ in items if k in old)
    state.clear()
    for k, v in items:
        if k == first:
            state.update(new)
        elif k not in old:
            state[k] = v


def split_entries(state: dict, fusion: Fusion, templates: list[str]) -> None:
    """Replace each `template.format(fused)` in `state` by one entry per part, in place, where
    the first of them was, part by part as the unfused module lists them."""
    split = {}
    for template in templates:
        if (key := template.format(fusion.fused)) in state:
            split[template] = _pieces(state[key], fusion.sizes)
    if not split:
        return
    pieces = {
        template.format(part): split[template][i]
        for i, part in enumerate(fusion.parts)
        for template in templates
        if template in split
    }
    _replace(state, {t.format(fusion.fused) for t in split}, pieces)


def _reorder(state: dict, prefix: str, order: tuple[str, ...]) -> None:
    """Sort the entries of `prefix`'s children named in `order` by it (stable), in place."""

    def child(key: str) -> str | None:
        name = key[len(prefix) :].split(".", 1)[0] if key.startswith(prefix) else None
        return name if name in order else None

    keys = [k for k in state if child(k)]
    if keys:
        ranked = sorted(keys, key=lambda k: order.index(child(k)))
        _replace(state, set(keys), {k: state[k] for k in ranked})


def _join(values: list, like: torch.Tensor | None):
    first = values[0]
    if not (isinstance(first, torch.Tensor) and first.dim() > 0):
        return first
    whole = torch.cat(values, dim=0)
    if isinstance(like, DTensor) and isinstance(whole, DTensor):
        # split off a dim-0 sharded weight, the parts were gathered: back to the weight's layout
        whole = whole.redistribute(like.device_mesh, like.placements)
    return whole


def join_entries(state: dict, fusion: Fusion, template: str, like=None) -> None:
    """The inverse of `split_entries` for one template: the parts' entries (all of them, or
    nothing happens) become one fused entry, laid out like `like` (the fused parameter)."""
    keys = [template.format(p) for p in fusion.parts]
    if all(k in state for k in keys):
        state[template.format(fusion.fused)] = _join([state.pop(k) for k in keys], like)


def _flat_templates(state: dict, module: str, fusion: Fusion) -> list[str]:
    """Templates of a per-parameter flattened dict's keys for one fused Linear: torch's flattened
    optimizer state `state.<fqn>.exp_avg`, `param_groups.<fqn>.lr` (`<fqn>` = module.fused.*)."""
    stem = f"{module}.{fusion.fused}." if module else f"{fusion.fused}."
    templates = []
    for key in state:
        kind, _, rest = key.partition(".")
        if rest.startswith(stem):
            templates.append(f"{kind}.{stem[: -len(fusion.fused) - 1]}{{}}.{rest[len(stem) :]}")
    return templates


def split_flat_state(state: dict, model: nn.Module) -> None:
    """`model`'s flattened optimizer state under the unfused parameter names, in place."""
    for name, module in fused_modules(model).items():
        split_entries(state, module.fusion, _flat_templates(state, name, module.fusion))


def join_flat_state(state: dict, model: nn.Module) -> None:
    """The inverse of `split_flat_state`, tensors laid out like the fused parameters."""
    for name, module in fused_modules(model).items():
        fusion = module.fusion
        linear = getattr(module, fusion.fused)
        first = Fusion(fusion.parts[0], fusion.parts, fusion.sizes)  # find the first part's keys
        for template in _flat_templates(state, name, first):
            suffix = template.split("{}.", 1)[1].split(".", 1)[0]  # weight or bias
            join_entries(state, fusion, template, getattr(linear, suffix))
