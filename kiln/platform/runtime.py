"""The Ray runtime: attach to a cluster (`--address` / `RAY_ADDRESS` / a spec's `ray.address`) or
start an embedded one, and start or release it between stages as each declares (`Resources`).

The embedded Ray binds to 127.0.0.1, starts no dashboard unless asked, and never attaches to a
stray head node that happens to run on the machine (`address="local"` starts a fresh one).
Only an embedded Ray is ever shut down; an attached cluster is left as found.

The embedded Ray's processes are told where *its* state API is (`RAY_API_SERVER_ADDRESS`).
Without that, Ray's state API in a worker finds "the" cluster by $RAY_ADDRESS,
/tmp/ray/ray_current_cluster or any GCS on the machine, and a Ray without a dashboard still
advertises 127.0.0.1:8265: with another cluster's dashboard there, Ray Train V2's
PlacementGroupCleaner asks that cluster about our controller, finds none and removes a live
run's placement group (a flake seen with several Ray clusters on one machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform import console
from kiln.platform.errors import ConfigError
from kiln.platform.ray_shutdown import shutdown_ray

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
    so an embedded Ray is shut down first -- unless a later stage of the run needs Ray again (a
    fresh start costs ~10 CPU seconds, an idle one ~0.6 GB); `reclaim=True`: shut down even then,
    the step wants that memory (the curator's dedup peak); `ray=None` (not declared): the
    runtime is left as it is and the step may still call `ctx.ray()`.
    `cpus`/`gpus` are checked against the cluster before the step starts.
    """

    ray: bool | None = None
    cpus: float = 0
    gpus: float = 0
    reclaim: bool = False


API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"  # Ray's own override for the state/job API URL
DEFAULT_DASHBOARD_PORT = 8265


def _bound_port(port: int = 0) -> socket.socket | None:
    """A socket bound (never listening) to 127.0.0.1:`port` (0: any), or None if taken."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def init_embedded(**init_kwargs) -> socket.socket | None:
    """`ray.init(**init_kwargs)` for a fresh local Ray whose processes reach only its own state API.

    With `include_dashboard`, the dashboard (the API server) listens on 127.0.0.1:8265, or a free
    port when that is taken. Without it there is no API server: the URL its processes get is a
    port held bound and never listening, so state queries are refused (Ray Train's cleaner then
    keeps waiting) rather than answered by another cluster. Returns that held socket (close it
    after `ray.shutdown`), or None. The caller's own environment is left as it was.
    """
    import ray

    guard = None
    if init_kwargs.get("include_dashboard"):
        probe = _bound_port(DEFAULT_DASHBOARD_PORT) or _bound_port()
        port = probe.getsockname()[1]
        probe.close()  # the dashboard binds it next
        init_kwargs.update(dashboard_host="127.0.0.1", dashboard_port=port)
    else:
        guard = _bound_port()
        port = guard.getsockname()[1]
    # Ray renices its workers to 15 to favour its own daemons on a dedicated node; on a laptop
    # or a shared machine that hands every busy neighbour the CPU, and a worker beside a busy
    # process waits minutes to start. kiln's workers are the job, so they run at kiln's own
    # niceness.
    init_kwargs["_system_config"] = {"worker_niceness": 0, **init_kwargs.get("_system_config", {})}
    before = os.environ.get(API_SERVER_ENV)
    os.environ[API_SERVER_ENV] = f"http://127.0.0.1:{port}"  # inherited by raylet -> workers
    try:
        with _quiet_auth_notice():
            ray.init(**init_kwargs)
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    finally:
        if before is None:
            os.environ.pop(API_SERVER_ENV, None)
        else:
            os.environ[API_SERVER_ENV] = before
    return guard


@contextlib.contextmanager
def _quiet_auth_notice():
    """Ray turns token auth on for a fresh local cluster when RAY_AUTH_MODE is unset and prints a
    notice on the terminal; kiln keeps that default and notes it in its log instead."""
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notice.setLevel(level)
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        log.debug("Ray token authentication is on (RAY_AUTH_MODE=disabled turns it off)")


def default_cpus_per_worker(cluster_cpus: float) -> float:
    """Fractional CPUs on small machines, so Ray Data actors and Train workers never deadlock."""
    return 0.5 if cluster_cpus < SMALL_MACHINE_CPUS else 1.0


def visible_gpus() -> int:
    """NVIDIA GPUs this process sees, as an embedded Ray would count them: the driver's devices
    (/proc/driver/nvidia/gpus, no torch import: ~1 s before a launch check), narrowed by
    CUDA_VISIBLE_DEVICES."""
    import sys

    if "torch" in sys.modules:  # already paid for: CUDA's own count
        torch = sys.modules["torch"]
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip()]))


@dataclass
class Runtime:
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = False
    num_gpus: int | None = None
    _started_here: bool = False
    _held_by: str | None = None  # a stage whose effect lives on this Ray (a running endpoint)
    _api_guard: socket.socket | None = None  # see init_embedded
    ray_later: bool = False  # a later stage of the run needs Ray: keep it through no-Ray steps

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

        address = self.address or os.environ.get("RAY_ADDRESS")
        to_driver = console.verbose()  # quiet: workers' output stays in Ray's logs (<run>/logs/ray)
        if address:
            log.info("attaching to Ray at %s", address)
            ray.init(address=address, log_to_driver=to_driver)
        else:
            self._api_guard = init_embedded(
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
        run_log = console.run_log_path()
        if run_log is not None:  # <run>/logs/ray -> this session's logs (a standalone command too)
            console.link_ray_logs(run_log.parent.parent)
        return self

    def provide(self, needs: Resources, who: str = "stage") -> None:
        """Start, keep or release Ray as `needs` declares; check the cluster can hold it."""
        if needs.ray is False:
            if self._held_by is None and (needs.reclaim or not self.ray_later):
                self.shutdown()
            return
        if needs.ray is None:
            return
        self.ensure()
        for name, wanted, have in (("CPU", needs.cpus, self.cpus), ("GPU", needs.gpus, self.gpus)):
            if wanted > have:
                raise ConfigError(f"{who}: needs {wanted:g} {name}s, the Ray cluster has {have:g}")

    @property
    def embedded(self) -> bool:
        """Ray was started here, by this runtime: one machine, no node can be preempted."""
        return self._started_here

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
        return default_cpus_per_worker(self.cpus)

    def planned_resources(self) -> tuple[float, float, str] | None:
        """(CPUs, GPUs, whose) this runtime's work can have, known before any Ray starts: the
        connected cluster's; for an embedded Ray not started yet, what it will have (the spec's
        `ray.num_cpus`/`num_gpus`, else this machine's); None for a cluster not yet attached."""
        import sys

        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            return self.cpus, self.gpus, "the Ray cluster"
        if self.address or os.environ.get("RAY_ADDRESS"):
            return None
        cpus = self.num_cpus if self.num_cpus is not None else os.cpu_count() or 1
        gpus = self.num_gpus if self.num_gpus is not None else visible_gpus()
        return float(cpus), float(gpus), "this machine"

    def hold(self, stage: str) -> None:
        """Keep Ray up until `shutdown` even before stages that need none (`stage` lives on it)."""
        import ray

        if ray.is_initialized():
            self._held_by = stage

    def shutdown(self) -> None:
        """Shut down a Ray this runtime started (an attached cluster is left running)."""
        if self._started_here:  # importing ray costs ~1 s where none was ever started
            import ray

            if ray.is_initialized():
                log.debug("shutting down the embedded Ray")
                shutdown_ray()
        if self._api_guard is not None:
            with contextlib.suppress(OSError):
                self._api_guard.close()
            self._api_guard = None
        self._started_here = False
        self._held_by = None
