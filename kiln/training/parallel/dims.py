"""The parallel layout, resolved once: degrees, world size, the device mesh and its flat dims.

Modelled on torchtitan's `ParallelDims`: built from `ParallelConfig` and the world size, validated
in one place, then asked (`tp_enabled`, `dp_rank`, `mesh("dp_shard_cp")`) instead of re-deriving
degrees from the config. The world mesh has the dims (pp, dp_replicate, dp_shard, cp, tp), sizes
of 1 allowed; the flattened dims live here rather than as attributes on torch's DeviceMesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.platform.errors import ConfigError
from kiln.training.config import ParallelConfig

if TYPE_CHECKING:  # torch is imported where a mesh is built: the layout checks need none
    from torch.distributed.device_mesh import DeviceMesh

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
# Gradients are averaged over every rank that sees different tokens: data and context ranks.
FLAT_DIMS = {
    "dp": ("dp_replicate", "dp_shard"),  # data: ranks that read different batches
    "dp_shard_cp": ("dp_shard", "cp"),  # FSDP's shard dim
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),  # gradient averaging (experts)
}


@dataclass
class ParallelDims:
    """Degrees of every parallelism for `world_size` ranks; `dp_shard=-1` takes what is left."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    world_size: int = 1
    _world_mesh: DeviceMesh | None = field(default=None, init=False, repr=False, compare=False)
    _flat: dict[str, DeviceMesh] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def from_config(cls, parallel: ParallelConfig, world_size: int | None = None) -> ParallelDims:
        """The layout of `parallel` on `world_size` ranks (None: the fewest it runs on)."""
        others = parallel.pp * parallel.dp_replicate * parallel.cp * parallel.tp
        if world_size is None:
            world_size = others * max(parallel.dp_shard, 1)
        return cls(
            pp=parallel.pp,
            dp_replicate=parallel.dp_replicate,
            dp_shard=parallel.dp_shard,
            cp=parallel.cp,
            tp=parallel.tp,
            ep=parallel.ep,
            world_size=world_size,
        )

    def _validate(self) -> None:
        for name in ("pp", "dp_replicate", "cp", "tp", "ep", "world_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        others = self.pp * self.dp_replicate * self.cp * self.tp
        if self.dp_shard == -1:
            if self.world_size % others:
                raise ConfigError(
                    f"parallel: world size {self.world_size} is not divisible by "
                    f"pp*dp_replicate*cp*tp = {others}"
                )
            self.dp_shard = self.world_size // others
        if self.dp_shard < 1:
            raise ConfigError(f"parallel.dp_shard must be >= 1 or -1, got {self.dp_shard}")
        if others * self.dp_shard != self.world_size:
            raise ConfigError(
                f"parallel: pp*dp_replicate*dp_shard*cp*tp = {others * self.dp_shard} "
                f"but the world size is {self.world_size}"
            )
        if self.ep > 1 and self.ep not in (self.dp_shard, self.dp_shard * self.cp):
            raise ConfigError(
                f"parallel.ep={self.ep} must equal dp_shard ({self.dp_shard}) "
                f"or dp_shard*cp ({self.dp_shard * self.cp})"
            )

    # -- what is on -------------------------------------------------------------------------

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded over dp_shard x cp (FSDP's dim)."""
        return self.dp_shard * self.cp > 1

    @property
    def dp_size(self) -> int:
        """Ranks that read different batches (TP/CP/PP peers of one replica read the same)."""
        return self.dp_replicate * self.dp_shard

    @property
    def loss_ranks(self) -> int:
        """Ranks whose local loss enters the global mean: all but the pp peers."""
        return self.world_size // self.pp

    # -- the mesh ---------------------------------------------------------------------------

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create the world mesh and its flattened dims (collective: every rank calls it)."""
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            device_type,
            tuple(getattr(self, d) for d in MESH_DIMS),
            mesh_dim_names=MESH_DIMS,
        )
        # Flattened dims are kept here: slicing them from the root mesh is deprecated.
        self._flat = {name: mesh[dims]._flatten(name) for name, dims in FLAT_DIMS.items()}
        self._world_mesh = mesh
        return mesh

    @property
    def world_mesh(self) -> DeviceMesh | None:
        """The mesh once `build_mesh` ran; None in a single process without torch.distributed."""
        return self._world_mesh

    def mesh(self, name: str | tuple[str, ...]) -> DeviceMesh:
        """A named dim, several dims, or a flattened dim (dp, dp_shard_cp, dp_cp)."""
        if self._world_mesh is None:
            raise RuntimeError("ParallelDims.mesh: build_mesh() has not run")
        if isinstance(name, str) and name in self._flat:
            return self._flat[name]
        return self._world_mesh[name]

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index (0 without a mesh)."""
        return 0 if self._world_mesh is None else self._flat["dp"].get_local_rank()


__all__ = ["FLAT_DIMS", "MESH_DIMS", "ParallelDims"]
