"""ParallelDims: the layout resolved once (degrees, -1 inference, validation, the mesh)."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError
from kiln.training.config import ParallelConfig
from kiln.training.parallel.dims import ParallelDims
from tests.training.distributed import run_distributed


def test_dp_shard_minus_one_takes_what_the_other_dims_leave():
    dims = ParallelDims.from_config(ParallelConfig(pp=2, tp=2), world_size=16)
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp) == (2, 1, 4, 1, 2)
    assert dims.dp_size == 4 and dims.loss_ranks == 8
    assert dims.pp_enabled and dims.tp_enabled and dims.dp_shard_enabled and dims.fsdp_enabled
    assert not (dims.cp_enabled or dims.ep_enabled or dims.dp_replicate_enabled)
    assert dims.world_mesh is None and dims.dp_rank == 0  # no mesh until build_mesh


def test_without_a_world_size_the_layout_names_the_fewest_ranks():
    assert ParallelDims.from_config(ParallelConfig(tp=2, cp=2)).world_size == 4
    assert ParallelDims.from_config(ParallelConfig(dp_shard=3, dp_replicate=2)).world_size == 6
    one = ParallelDims.from_config(ParallelConfig())
    assert one.world_size == 1 and not one.dp_enabled and not one.fsdp_enabled


def test_cp_alone_is_sharded_by_fsdp_but_reads_one_batch():
    dims = ParallelDims.from_config(ParallelConfig(cp=2), world_size=2)
    assert dims.dp_shard == 1 and dims.dp_size == 1 and dims.fsdp_enabled


@pytest.mark.parametrize(
    ("parallel", "world", "message"),
    [
        ({"tp": 2, "dp_shard": 2}, 8, "world size is 8"),
        ({"tp": 3}, 8, "not divisible by pp\\*dp_replicate\\*cp\\*tp = 3"),
        ({"dp_shard": 4, "ep": 3}, 4, "parallel.ep=3"),
        ({"dp_shard": 2, "cp": 2, "ep": 8}, 4, "parallel.ep=8"),
        ({"dp_shard": 0}, 4, "parallel.dp_shard"),
    ],
)
def test_invalid_layouts_name_the_field(parallel, world, message):
    with pytest.raises(ConfigError, match=message):
        ParallelDims.from_config(ParallelConfig(**parallel), world_size=world)


def test_ep_may_span_dp_shard_or_dp_shard_times_cp():
    assert ParallelDims.from_config(ParallelConfig(ep=2), world_size=2).ep_enabled
    assert ParallelDims.from_config(ParallelConfig(cp=2, ep=4), world_size=4).ep == 4


def _mesh_facts() -> dict:
    dims = ParallelDims.from_config(ParallelConfig(dp_shard=2, cp=2), world_size=4)
    mesh = dims.build_mesh("cpu")
    return {
        "names": mesh.mesh_dim_names,
        "sizes": {name: dims.mesh(name).size() for name in ("dp", "dp_shard_cp", "dp_cp", "tp")},
        "dp": (dims.dp_rank, dims.dp_size),
        "cp_rank": dims.mesh("cp").get_local_rank(),
        "no_extra_attrs": not hasattr(mesh, "kiln_flat"),
    }


@pytest.mark.slow
def test_mesh_and_flat_dims_on_four_ranks():
    facts = run_distributed(_mesh_facts, 4)
    assert facts[0]["names"] == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert facts[0]["sizes"] == {"dp": 2, "dp_shard_cp": 4, "dp_cp": 4, "tp": 1}
    # ranks are laid out row-major over (pp, dp_replicate, dp_shard=2, cp=2, tp): cp is fastest
    assert [f["dp"] for f in facts] == [(r // 2, 2) for r in range(4)]
    assert [f["cp_rank"] for f in facts] == [r % 2 for r in range(4)]
    assert all(f["no_extra_attrs"] for f in facts)
