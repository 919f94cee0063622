"""The Ray runtime: attach to a cluster (`--address` / `RAY_ADDRESS` / a spec's `ray.address`) or
start an embedded one, and start or release it between stages as each declares (`Resources`).

The embedded Ray binds to 127.0.0.1, starts no dashboard unless asked, and never attaches to a
stray head node that happens to run on the machine (`address="local"` starts a fresh one).
Only an embedded Ray is ever shut down; an attached cluster is left as found.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.errors import ConfigError

log = logging.getLogger("kiln")

SMALL_MACHINE_CPUS = 8


class RayConfig(BaseModel):
    """A spec's top-level `ray:` block: which Ray the run uses."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None, description="Ray cluster to attach to (--address and $RAY_ADDRESS win over it)."
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of the embedded Ray (default: all of the machine's)."
    )
    num_gpus: int | None = Field(
        None, ge=0, description="GPUs of the embedded Ray (default: all visible ones)."
    )
    dashboard: bool = Field(False, description="Start the Ray dashboard with the embedded Ray.")


@dataclass(frozen=True)
class Resources:
    """What a stage (or one step of it) needs from the runtime.

    `ray=True`: Ray is started (or attached) before the step; `ray=False`: the step needs no Ray,
    so an embedded Ray is shut down first and its memory goes to the step; `ray=None` (not
    declared): the runtime is left as it is and the step may still call `ctx.ray()`.
    `cpus`/`gpus` are checked against the cluster before the step starts.
    """

    ray: bool | None = None
    cpus: float = 0
    gpus: float = 0


@dataclass
class Runtime:
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    num_gpus: int | None = None
    _started_here: bool = False
    _held_by: str | None = None  # a stage whose effect lives on this Ray (a running endpoint)

    @classmethod
    def from_config(cls, cfg: RayConfig, address: str | None = None, dashboard: bool = False):
        """A runtime for a spec's `ray:` block; a command-line address/dashboard wins."""
        return cls(
            address=address or os.environ.get("RAY_ADDRESS") or cfg.address,
            num_cpus=cfg.num_cpus,
            num_gpus=cfg.num_gpus,
            dashboard=dashboard or cfg.dashboard,
        )

    def ensure(self) -> Runtime:
        """Connect to Ray once; later calls are free."""
        import ray

        if ray.is_initialized():
            return self
        from kiln.platform import console

        address = self.address or os.environ.get("RAY_ADDRESS")
        to_driver = console.verbose()  # quiet: workers' output stays in Ray's logs (<run>/logs/ray)
        if address:
            log.info("attaching to Ray at %s", address)
            ray.init(address=address, log_to_driver=to_driver)
        else:
            ray.init(
                address="local",
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                include_dashboard=self.dashboard,
                _node_ip_address="127.0.0.1",
                configure_logging=False,
                log_to_driver=to_driver,
            )
            self._started_here = True
        console.route_library_loggers()
        return self

    def provide(self, needs: Resources, who: str = "stage") -> None:
        """Start, keep or release Ray as `needs` declares; check the cluster can hold it."""
        if needs.ray is False:
            if self._held_by is None:
                self.shutdown()
            return
        if needs.ray is None:
            return
        self.ensure()
        for name, wanted, have in (("CPU", needs.cpus, self.cpus), ("GPU", needs.gpus, self.gpus)):
            if wanted > have:
                raise ConfigError(f"{who}: needs {wanted:g} {name}s, the Ray cluster has {have:g}")

    @property
    def cpus(self) -> float:
        import ray

        return float(ray.cluster_resources().get("CPU", 0))

    @property
    def gpus(self) -> float:
        import ray

        return float(ray.cluster_resources().get("GPU", 0))

    def cpus_per_worker(self) -> float:
        """Fractional CPUs on small machines, so Ray Data actors and Train workers never
        deadlock."""
        return 0.5 if self.cpus < SMALL_MACHINE_CPUS else 1.0

    def hold(self, stage: str) -> None:
        """Keep Ray up until `shutdown` even before stages that need none (`stage` lives on it)."""
        import ray

        if ray.is_initialized():
            self._held_by = stage

    def shutdown(self) -> None:
        """Shut down a Ray this runtime started (an attached cluster is left running)."""
        import ray

        if self._started_here and ray.is_initialized():
            log.debug("shutting down the embedded Ray")
            ray.shutdown()
        self._started_here = False
        self._held_by = None
