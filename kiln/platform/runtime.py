"""The Ray runtime: attach to a cluster (`--address` / `RAY_ADDRESS`) or start an embedded one.

The embedded Ray binds to 127.0.0.1, starts no dashboard unless asked, and never attaches to a
stray head node that happens to run on the machine (`address="local"` starts a fresh one).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("kiln")

SMALL_MACHINE_CPUS = 8


@dataclass
class Runtime:
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    _started_here: bool = False

    def ensure(self) -> Runtime:
        """Connect to Ray once; later calls are free."""
        import ray

        if ray.is_initialized():
            return self
        address = self.address or os.environ.get("RAY_ADDRESS")
        if address:
            log.info("attaching to Ray at %s", address)
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(
                address="local",
                num_cpus=self.num_cpus,
                include_dashboard=self.dashboard,
                _node_ip_address="127.0.0.1",
                configure_logging=False,
                log_to_driver=True,
            )
            self._started_here = True
        return self

    @property
    def cpus(self) -> float:
        import ray

        return float(ray.cluster_resources().get("CPU", 0))

    @property
    def gpus(self) -> float:
        import ray

        return float(ray.cluster_resources().get("GPU", 0))

    def cpus_per_worker(self) -> float:
        """Fractional CPUs on small machines, so Ray Data actors and Train workers never deadlock."""
        return 0.5 if self.cpus < SMALL_MACHINE_CPUS else 1.0

    def shutdown(self) -> None:
        import ray

        if self._started_here and ray.is_initialized():
            ray.shutdown()
        self._started_here = False
