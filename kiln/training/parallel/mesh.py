"""The world DeviceMesh: dims (pp, dp_replicate, dp_shard, cp, tp), sizes of 1 allowed."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from kiln.training.config import ParallelConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_mesh(parallel: ParallelConfig, device: str | None = None) -> DeviceMesh:
    """One mesh for every parallelism; also flattens `dp_shard_cp` (FSDP's dim) and `dp` (data)."""
    world = dist.get_world_size()
    p = parallel.resolved(world)
    mesh = init_device_mesh(
        device or device_type(),
        (p.pp, p.dp_replicate, p.dp_shard, p.cp, p.tp),
        mesh_dim_names=MESH_DIMS,
    )
    # Gradients are averaged over every rank that sees different tokens: data and context ranks.
    # Flattened meshes are kept on the mesh object (slicing them from the root is deprecated).
    mesh.kiln_flat = {
        "dp_shard_cp": mesh["dp_shard", "cp"]._flatten("dp_shard_cp"),
        "dp": mesh["dp_replicate", "dp_shard"]._flatten("dp"),
        "dp_cp": mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp"),
    }
    return mesh


def submesh(mesh: DeviceMesh, name: str | tuple[str, ...]) -> DeviceMesh:
    """A named dim, several dims, or a flattened dim (dp_shard_cp, dp, dp_cp) of the world mesh."""
    flat = getattr(mesh, "kiln_flat", {})
    if isinstance(name, str) and name in flat:
        return flat[name]
    return mesh[name]


def dp_coords(mesh: DeviceMesh | None) -> tuple[int, int]:
    """(dp_rank, dp_size) for the data loader: TP/CP/PP ranks of one replica read the same data."""
    if mesh is None:
        return 0, 1
    dp = submesh(mesh, "dp")
    return dp.get_local_rank(), dp.size()
