"""Fused input projections (`model.fused_projections`): attention's q/k/v as one `wqkv` Linear and
the gated FFN's gate/up as one `w13` Linear, so a block's input side runs 2 GEMMs instead of 5.

Fused in memory only. State dicts keep the unfused names (`wq`/`wk`/`wv`, `w1`/`w3`): the module
splits its fused weight into row blocks on the way out (`state_dict`) and joins them on the way
in (`load_state_dict`), so checkpoints, Hugging Face and GGUF files and every name map stay as
they are, and a checkpoint saved fused loads unfused and the reverse. `split_entries` and
`join_entries` do the same for any per-parameter dict (the optimizer's flattened state).

Row layout: `[q; k; v]` in one process. Tensor parallelism splits a Linear's rows into equal
blocks, one per rank, and each rank needs its own heads' q, k and v (its own gate and up rows):
`use_shard_blocks` lays the rows out as `[q_0; k_0; v_0; q_1; k_1; v_1; ...]` first (vLLM's
QKVParallelLinear and Megatron's SwiGLU fc1 hold the same per-rank blocks), so a plain row split
gives rank r the block `[q_r; k_r; v_r]` and its forward splits that block by the parts' widths
over the number of blocks. (Megatron's qkv interleaves per KV-head group instead, one layout for
every tp; per-rank blocks leave one process's layout and forward as they were.) The state
dict hooks undo the layout: a DTensor whose rows are split into exactly those blocks splits
locally (rank r's `wq` rows are its block's q rows, no gather), anything else through the
whole tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

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
    shards: int = 1  # rows as this many blocks, each holding its share of every part

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """Each part's rows in one block (what one tensor-parallel rank's output holds)."""
        return tuple(size // self.shards for size in self.sizes)


def fuse(module: nn.Module, fusion: Fusion) -> None:
    """Give `module` (holding the Linear `fusion.fused`) state dicts under the parts' names."""
    module.fusion = fusion

    # the hooks read module.fusion when they run: use_shard_blocks changes its layout
    def split(module, state, prefix, local_metadata):
        split_entries(state, module.fusion, [f"{prefix}{{}}.{suffix}" for suffix in SUFFIXES])
        if module.fusion.order:
            _reorder(state, prefix, module.fusion.order)

    def join(module, state, prefix, *args):
        linear = getattr(module, module.fusion.fused)
        for suffix in SUFFIXES:
            join_entries(state, module.fusion, f"{prefix}{{}}.{suffix}", getattr(linear, suffix))

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


def to_shard_blocks(whole: torch.Tensor, fusion: Fusion) -> torch.Tensor:
    """Rows `[p0; p1; ...]` (the parts one after another) -> `fusion.shards` blocks, block r
    holding row block r of every part: `[p0_0; p1_0; ...; p0_1; p1_1; ...]`."""
    if fusion.shards == 1:
        return whole
    rest = whole.shape[1:]
    parts = whole.split(list(fusion.sizes))
    blocks = [p.reshape(fusion.shards, -1, *rest) for p in parts]
    return torch.cat(blocks, dim=1).reshape(whole.shape)


def from_shard_blocks(blocked: torch.Tensor, fusion: Fusion) -> list[torch.Tensor]:
    """The inverse of `to_shard_blocks`: each part's rows, whole."""
    if fusion.shards == 1:
        return list(blocked.split(list(fusion.sizes)))
    rest = blocked.shape[1:]
    blocks = blocked.reshape(fusion.shards, -1, *rest).split(list(fusion.block_sizes), dim=1)
    return [b.reshape(size, *rest) for b, size in zip(blocks, fusion.sizes, strict=True)]


@torch.no_grad()
def use_shard_blocks(model: nn.Module, shards: int) -> None:
    """Lay every fused Linear's rows (weight, bias) out as `shards` blocks, in place, before
    tensor parallelism splits them into `shards` row blocks. Each part's rows must divide."""
    for module in fused_modules(model).values():
        fusion = module.fusion
        if fusion.shards != 1:
            raise ValueError(f"fused rows already laid out in {fusion.shards} blocks")
        laid_out = Fusion(fusion.fused, fusion.parts, fusion.sizes, fusion.order, shards)
        linear = getattr(module, fusion.fused)
        for suffix in SUFFIXES:
            if (param := getattr(linear, suffix)) is not None and not param.is_meta:
                param.copy_(to_shard_blocks(param, laid_out))
        module.fusion = laid_out


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


def _rows_in_blocks(tensor: DTensor, fusion: Fusion) -> bool:
    """Whether each rank's local rows are whole blocks of `fusion`'s layout: rows not split
    (one block), or split by exactly one mesh dimension into `fusion.shards` even chunks."""
    row_dims = [i for i, p in enumerate(tensor.placements) if getattr(p, "dim", None) == 0]
    if fusion.shards == 1:
        return not row_dims
    return (
        len(row_dims) == 1
        and type(tensor.placements[row_dims[0]]) is Shard  # not FSDP's strided shard over TP
        and tensor.device_mesh.size(row_dims[0]) == fusion.shards
    )


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= size
    return tuple(reversed(stride))


def _pieces(value, fusion: Fusion) -> list:
    """Each part's rows of a fused tensor; anything else (Adam's scalar step, a group's lr)
    for every part."""
    if not (isinstance(value, torch.Tensor) and value.dim() > 0):
        return [value] * len(fusion.parts)
    if not isinstance(value, DTensor):
        return from_shard_blocks(value, fusion)
    mesh, rest = value.device_mesh, tuple(value.shape[1:])
    if _rows_in_blocks(value, fusion):  # this rank's block, split in place: views, no gather
        local = value.to_local().split(list(fusion.block_sizes))
        return [
            DTensor.from_local(
                piece,
                mesh,
                value.placements,
                run_check=False,
                shape=(size, *rest),
                stride=_contiguous_stride((size, *rest)),
            )
            for piece, size in zip(local, fusion.sizes, strict=True)
        ]
    # rows sharded otherwise (FSDP's 1-D bias shards): through the whole tensor, replicated
    whole = from_shard_blocks(value.full_tensor(), fusion)
    replicated = [Replicate()] * mesh.ndim
    return [DTensor.from_local(p, mesh, replicated, run_check=False) for p in whole]


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
            split[template] = _pieces(state[key], fusion)
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


def _join(values: list, like: torch.Tensor | None, fusion: Fusion):
    """The fused tensor of the parts' `values`, laid out like `like` (the fused parameter)."""
    first = values[0]
    if not (isinstance(first, torch.Tensor) and first.dim() > 0):
        return first
    if (
        isinstance(like, DTensor)
        and all(isinstance(v, DTensor) and v.placements == like.placements for v in values)
        and _rows_in_blocks(like, fusion)
    ):  # each part's local rows are this rank's share of the block: join in place
        local = torch.cat([v.to_local() for v in values])
        return DTensor.from_local(
            local,
            like.device_mesh,
            like.placements,
            run_check=False,
            shape=like.shape,
            stride=like.stride(),
        )
    whole = [v.full_tensor() if isinstance(v, DTensor) else v for v in values]
    blocked = to_shard_blocks(torch.cat(whole), fusion)
    if isinstance(like, DTensor):  # every rank holds the whole: each keeps its own shard
        return distribute_tensor(blocked, like.device_mesh, like.placements, src_data_rank=None)
    return blocked


def join_entries(state: dict, fusion: Fusion, template: str, like=None) -> None:
    """The inverse of `split_entries` for one template: the parts' entries (all of them, or
    nothing happens) become one fused entry, laid out like `like` (the fused parameter)."""
    keys = [template.format(p) for p in fusion.parts]
    if all(k in state for k in keys):
        state[template.format(fusion.fused)] = _join([state.pop(k) for k in keys], like, fusion)


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
