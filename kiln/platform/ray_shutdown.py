"""`ray.shutdown()` with a bound.

Ray's shutdown makes blocking calls to the GCS without a deadline (`GcsSubscriber.close`), so a
GCS that stopped answering hangs the process at exit for good: seen once at the end of a
`make test` beside `stress-ng --cpu 2` (the GCS alive, one of its threads blocked on a mutex).
When the Ray was started by this process, its own processes are SIGKILLed after `timeout_s`,
which fails those calls and lets the shutdown finish. A cluster this process only attached to
is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

log = logging.getLogger("kiln")

SHUTDOWN_TIMEOUT_S = 60.0


def _own_ray_pids() -> list[int]:
    """Pids of the Ray processes this process started (none when it attached to a cluster)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # noqa: SLF001
    if node is None:
        return []
    return [info.process.pid for infos in node.all_processes.values() for info in infos]


def _kill(pids: list[int], timeout_s: float) -> None:
    log.warning("Ray did not shut down in %.0f s: killing its %d processes", timeout_s, len(pids))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def shutdown_ray(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    import ray

    pids = _own_ray_pids()
    watchdog = threading.Timer(timeout_s, _kill, args=(pids, timeout_s))
    watchdog.daemon = True
    if pids:
        watchdog.start()
    try:
        ray.shutdown()
    finally:
        watchdog.cancel()
