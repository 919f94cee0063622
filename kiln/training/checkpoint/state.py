"""What a checkpoint holds, as one DCP state dict built from the run's stateful components.

Layout (DCP flattens nested dicts into dotted keys):
    model.<global fqn>                  params of every local model part (DTensor shards)
    optimizer.state.<fqn>.<name>        optimizer state, flattened per parameter so it reshards
    optimizer.param_groups.<fqn>.<opt>  across any PP split (torchtitan's trick)
    lr_scheduler.*                      the first scheduler (all parts share one schedule)
    train.step, train.tokens_seen       the TrainState
    dataloader.dp<r>                    each data-parallel rank's loader position (JSON bytes)
    rng.rank<r>                         each rank's RNG states (JSON bytes; same layout only)

Model and optimizer keys use global parameter names, so a checkpoint written under one
(pp, dp_replicate, dp_shard, cp, tp, ep) layout loads into any other, and into one process.
Expert-parallel weights are plain tensors holding rows of the whole [E, ., .] weights; their
model state is already a dim-0 DTensor shard (expert_parallel.shard_expert_state), and their
optimizer state becomes one here, so DCP writes whole expert tensors. Fused projections
(`model.fused_projections`) are saved under their unfused names, model and optimizer state
alike, so a checkpoint loads fused or not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from kiln.model.fused_projections import (
    join_flat_state,
    load_model_state_dict,
    model_state_dict,
    split_flat_state,
)
from kiln.model.moe import GroupedExperts
from kiln.training.parallel.expert_parallel import ExpertParallelMoE

_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
# Which kernels step the optimizer is this run's choice (its device, its layout), not the run's
# that saved the checkpoint: a CPU run's foreach must not become a GPU run's, nor the reverse.
_KERNEL_FLAGS = ("foreach", "fused")


def model_state(parts: list[torch.nn.Module]) -> tuple[dict[str, Any], list[list[str]]]:
    """Merged model state of all local parts, and each part's keys (to split it again)."""
    merged: dict[str, Any] = {}
    keys = []
    for part in parts:
        sd = model_state_dict(part)
        keys.append(list(sd))
        merged.update(sd)
    return merged, keys


def _expert_meshes(part: torch.nn.Module) -> dict[str, DeviceMesh]:
    """`state.<fqn>.` prefix of each expert-parallel weight's optimizer state -> its ep mesh."""
    meshes = {}
    for name, module in part.named_modules():
        if isinstance(module, ExpertParallelMoE):
            fqn = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
            for weight in GroupedExperts.WEIGHTS:
                meshes[f"state.{fqn}.experts.{weight}."] = module.ep_mesh
    return meshes


def _expert_mesh(key: str, value: Any, meshes: dict[str, DeviceMesh]) -> DeviceMesh | None:
    if not isinstance(value, torch.Tensor) or value.dim() == 0:  # Adam's step is a scalar
        return None
    return next((mesh for prefix, mesh in meshes.items() if key.startswith(prefix)), None)


def optimizer_state(parts, optimizers) -> tuple[dict[str, Any], list[list[str]]]:
    merged: dict[str, Any] = {}
    keys = []
    for part, opt in zip(parts, optimizers, strict=True):
        sd = get_optimizer_state_dict(part, opt, options=_OPTIM_OPTIONS)
        split_flat_state(sd, part)
        meshes = _expert_meshes(part)
        for key, value in sd.items():
            if (mesh := _expert_mesh(key, value, meshes)) is not None:
                sd[key] = DTensor.from_local(value, mesh, [Shard(0)], run_check=False)
        keys.append(list(sd))
        merged.update(sd)
    return merged, keys


def apply_model_state(parts, state: dict[str, Any], keys: list[list[str]]) -> None:
    for part, part_keys in zip(parts, keys, strict=True):
        load_model_state_dict(part, {k: state[k] for k in part_keys})


def apply_optimizer_state(parts, optimizers, state: dict[str, Any], keys: list[list[str]]) -> None:
    for part, opt, part_keys in zip(parts, optimizers, keys, strict=True):
        kernels = [{k: g.get(k) for k in _KERNEL_FLAGS} for g in opt.param_groups]
        meshes = _expert_meshes(part)
        part_state = {k: state[k] for k in part_keys}
        for key, value in part_state.items():
            if isinstance(value, DTensor) and _expert_mesh(key, value, meshes) is not None:
                part_state[key] = value.to_local()  # the rows this rank's parameter holds
        join_flat_state(part_state, part)
        set_optimizer_state_dict(part, opt, part_state, options=_OPTIM_OPTIONS)
        for group, flags in zip(opt.param_groups, kernels, strict=True):
            group.update(flags)
