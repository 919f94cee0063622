"""Expert parallelism: each rank of the `ep` group holds n_experts/ep experts of every MoE layer.

Routing stays local (each rank routes its own tokens, so the load-balancing loss and the capacity
are those of the rank's micro-batch, as in a single-process run of that micro-batch). The
assignments, sorted by expert, go to the experts' owners with `all_to_all_single` (the per-expert
counts are exchanged first, also with `all_to_all_single`), the owners run their experts, and a
second `all_to_all_single` brings the results back. Both exchanges are autograd-aware.

Rank j holds experts [j*E/ep, (j+1)*E/ep): rows j*E/ep.. of the layer's 3-D expert weights. In
a state dict they are DTensors sharded on dim 0 over the ep mesh (the module's state-dict hook;
the parameters themselves stay plain tensors), so a DCP checkpoint holds the whole [E, ., .]
weights and loads under any ep size, and into one process.

Gradients: expert weights are not FSDP-managed (`expert_parameters(model)` are FSDP's
`ignored_params`). An expert's gradient already sums the contributions of every rank in its ep
group; a hook on each expert weight divides it by the data-parallel size (local, no collective),
and `reduce_expert_grads` sums the accumulated gradients over the ranks holding copies of the same
expert (the rest of the data-parallel mesh, when ep < dp) once per optimizer step, flattened into
buckets of up to EXPERT_BUCKET_BYTES: one all-reduce per bucket, not one per weight per
micro-batch. `split_for_grad_norm` (which the trainer calls before clipping) runs it, so expert
gradients match the averaged gradients FSDP produces for the other weights.
Clipping: expert weights differ across the ep group, so the global grad norm must add
`expert_grad_norm_sq(model)` (already summed over the ep group) to the other parameters' squared
norm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from kiln.model.moe import GroupedExperts, MoE
from kiln.platform.errors import ConfigError


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; the backward runs it the other way round."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.output_splits, ctx.input_splits, ctx.group = output_splits, input_splits, group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad_in = grad.new_empty((sum(ctx.input_splits), *grad.shape[1:]))
        dist.all_to_all_single(
            grad_in, grad.contiguous(), ctx.input_splits, ctx.output_splits, group=ctx.group
        )
        return grad_in, None, None, None


class ExpertParallelMoE(MoE):
    """An MoE whose experts live on the ranks of `ep_group` (set by apply_expert_parallel)."""

    ep_group: dist.ProcessGroup
    ep_mesh: DeviceMesh
    expert_grad_hook: Callable[[torch.Tensor], torch.Tensor]
    replica_group: dist.ProcessGroup | None  # ranks holding copies of my experts

    def run_experts(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep = dist.get_world_size(self.ep_group)
        n_local = self.n_experts // ep
        # How many rows each source rank sends to each of my experts: [ep, n_local].
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts.contiguous(), group=self.ep_group)
        # The layer's one host sync: both count tables at once (all_to_all needs host splits).
        both = torch.cat([counts, recv_counts]).tolist()
        sent, received_counts = both[: self.n_experts], both[self.n_experts :]
        send_splits = [sum(sent[r * n_local : (r + 1) * n_local]) for r in range(ep)]
        recv_splits = [sum(received_counts[r * n_local : (r + 1) * n_local]) for r in range(ep)]

        received = _AllToAll.apply(x, recv_splits, send_splits, self.ep_group)
        # Rows arrive by source, then expert: regroup by local expert (stable: source order kept
        # within an expert). output_size from the host keeps repeat_interleave sync-free.
        expert_of_row = (
            torch.arange(n_local, device=x.device)
            .repeat(ep)
            .repeat_interleave(recv_counts, output_size=sum(recv_splits))
        )
        order = torch.argsort(expert_of_row, stable=True)
        per_expert = recv_counts.view(ep, n_local).sum(0)
        # Expert weights sit outside FSDP (ignored_params) and stay fp32: grouped_swiglu casts
        # them to the compute dtype, as FSDP's mixed-precision policy does for the rest.
        y = self.experts(received[order], per_expert).to(x.dtype)
        y = torch.empty_like(y).index_copy(0, order, y)  # back to (source, expert) order
        return _AllToAll.apply(y, send_splits, recv_splits, self.ep_group)


def _dp_mesh_of(ep_mesh: DeviceMesh) -> DeviceMesh | None:
    """The data-parallel dims (dp_replicate, dp_shard, cp) of the world mesh ep_mesh came from."""
    root = ep_mesh._get_root_mesh() if hasattr(ep_mesh, "_get_root_mesh") else None
    names = tuple(root.mesh_dim_names or ()) if root is not None else ()
    dims = tuple(d for d in ("dp_replicate", "dp_shard", "cp") if d in names and root[d].size() > 1)
    if not dims:
        return None
    return root[dims] if len(dims) > 1 else root[dims[0]]


def _replica_group(ep_mesh: DeviceMesh, dp_mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """Ranks of my data-parallel group that hold the same experts as I do (None if only me)."""
    mine = (tuple(sorted(dp_mesh.mesh.flatten().tolist())), ep_mesh.get_local_rank())
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    groups: dict[tuple, list[int]] = {}
    for rank, key in enumerate(everyone):
        groups.setdefault(key, []).append(rank)
    if all(len(ranks) == 1 for ranks in groups.values()):
        return None
    group, _ = dist.new_subgroups_by_enumeration(sorted(groups.values()))
    return group


def apply_expert_parallel(
    model: nn.Module, ep_mesh: DeviceMesh, dp_mesh: DeviceMesh | None = None
) -> nn.Module:
    """Keep this rank's share of every MoE layer's experts and dispatch tokens to their owners.

    `dp_mesh`: the mesh over which the trainer averages gradients (default: the dp_replicate,
    dp_shard and cp dims of ep_mesh's world mesh). It must contain ep_mesh.
    """
    group = ep_mesh.get_group()
    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    dp_mesh = dp_mesh if dp_mesh is not None else _dp_mesh_of(ep_mesh)
    dp_size = dp_mesh.size() if dp_mesh is not None else ep
    replicas = _replica_group(ep_mesh, dp_mesh) if dp_mesh is not None and dp_size > ep else None

    for _name, module in model.named_modules():
        if not isinstance(module, MoE):
            continue
        if module.n_experts % ep:
            raise ConfigError(
                f"model.n_experts={module.n_experts} must be a multiple of parallel.ep={ep}"
            )
        n_local = module.n_experts // ep
        module.experts.keep(range(rank * n_local, (rank + 1) * n_local))
        shard_expert_state(module.experts, ep_mesh)
        module.__class__ = ExpertParallelMoE
        module.ep_group = group
        module.ep_mesh = ep_mesh
        module.expert_grad_hook = _expert_grad_hook(dp_size)
        module.replica_group = replicas
    register_expert_grad_hooks(model)
    return model


def shard_expert_state(experts: GroupedExperts, ep_mesh: DeviceMesh) -> None:
    """State dicts see this rank's expert rows as dim-0 shards of the whole weights; loading
    takes such DTensors, or whole weights (one-process state), and keeps this rank's rows."""

    def to_dtensor(module, state, prefix, local_metadata):
        for name in GroupedExperts.WEIGHTS:
            key = prefix + name
            state[key] = DTensor.from_local(state[key], ep_mesh, [Shard(0)], run_check=False)

    def to_local(module, state, prefix, *args):
        for name in GroupedExperts.WEIGHTS:
            value = state.get(prefix + name)
            if isinstance(value, DTensor):
                state[prefix + name] = value.to_local()
            elif value is not None and value.shape[0] != len(experts):  # the whole weights
                state[prefix + name] = value[experts.first : experts.first + len(experts)]

    experts.register_state_dict_post_hook(to_dtensor)
    experts.register_load_state_dict_pre_hook(to_local)


def register_expert_grad_hooks(model: nn.Module) -> None:
    """Hook every materialised expert weight (again after `to_empty`, which replaces the
    parameters built on the meta device, and their hooks with them)."""
    for module in model.modules():
        if isinstance(module, ExpertParallelMoE):
            for param in module.experts.parameters():
                if not param.is_meta:
                    param.register_hook(module.expert_grad_hook)


def _expert_grad_hook(dp_size: int):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad / dp_size

    return hook


EXPERT_BUCKET_BYTES = 64 * 2**20


def reduce_expert_grads(model_parts: list[nn.Module]) -> None:
    """Sum expert gradients over each replica group: flattened buckets, one all-reduce each.

    Collective over the replica groups; a no-op when every expert has one owner (ep == dp).
    Missing gradients become zeros so every replica flattens the same buckets.
    """
    by_group: dict[tuple, list[torch.Tensor]] = {}
    for part in model_parts:
        for m in part.modules():
            if isinstance(m, ExpertParallelMoE) and getattr(m, "replica_group", None) is not None:
                for p in m.experts.parameters():
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    by_group.setdefault((m.replica_group, p.grad.dtype), []).append(p.grad)
    for (group, _dtype), grads in by_group.items():
        for bucket in _buckets(grads, EXPERT_BUCKET_BYTES):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=group)
            for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                grad.copy_(reduced)


def _buckets(tensors: list[torch.Tensor], max_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of tensors of at most max_bytes each (a larger tensor goes alone)."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if buckets[-1] and size + nbytes > max_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(t)
        size += nbytes
    return [b for b in buckets if b]


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """Every expert weight of every MoE layer (FSDP's `ignored_params`: they are EP-sharded)."""
    return {p for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()}


def expert_grad_norm_sq(model: nn.Module) -> torch.Tensor:
    """Squared L2 norm of the expert gradients over the whole ep group (add before the sqrt)."""
    total = torch.zeros((), dtype=torch.float32)
    group = None
    for m in model.modules():
        if isinstance(m, ExpertParallelMoE):
            group = m.ep_group
        if isinstance(m, MoE):
            for p in m.experts.parameters():
                if p.grad is not None:
                    total = total.to(p.grad.device) + p.grad.detach().float().pow(2).sum()
    if group is not None:
        dist.all_reduce(total, group=group)
    return total


def sharded_expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """Expert weights of expert-parallel layers: they differ across the ep group."""
    return {
        p
        for m in model.modules()
        if isinstance(m, ExpertParallelMoE)
        for p in m.experts.parameters()
    }


def split_for_grad_norm(
    model_parts: list[nn.Module],
) -> tuple[list[nn.Parameter], torch.Tensor | None]:
    """(the parameters a global grad norm reduces as usual, the squared norm of the EP-sharded
    expert gradients summed over the ep group, or None when no layer is expert-parallel).

    Collective over the ep group when experts are sharded: every rank must call it. It first
    sums the expert gradients over their replicas (`reduce_expert_grads`).
    """
    experts: set[nn.Parameter] = set()
    for part in model_parts:
        experts |= sharded_expert_parameters(part)
    params = [p for part in model_parts for p in part.parameters() if p not in experts]
    if not experts:
        return params, None
    reduce_expert_grads(model_parts)
    return params, sum(expert_grad_norm_sq(part) for part in model_parts)


def local_expert_ids(module: MoE) -> list[int]:
    """Global ids of the experts this rank holds in one MoE layer."""
    return list(module.experts.ids)


__all__ = [
    "ExpertParallelMoE",
    "apply_expert_parallel",
    "expert_grad_norm_sq",
    "expert_parameters",
    "local_expert_ids",
    "reduce_expert_grads",
    "register_expert_grad_hooks",
    "sharded_expert_parameters",
    "split_for_grad_norm",
]
