"""What an idle `kiln serve` costs in Ray's background work, trimmed where Ray lets us.

Measured on an idle endpoint (psutil over the process tree, 15 s): 0.07 cores, of which Ray
Serve's controller took the largest share (0.02), because it reconciles every deployment ten
times a second (RAY_SERVE_CONTROL_LOOP_INTERVAL_S, 0.1 s). Once a second is enough for an
endpoint whose replicas change only when it is deployed, scaled or a replica dies; requests never
pass through the controller. The rest (GCS, raylet, the proxy's and replica's own event loops,
the dashboard agent) has no setting. The variables reach the controller only through an embedded
Ray this process starts (its processes inherit our environment); a value the user set wins.

Two more of the settings Ray Serve's own RAY_SERVE_THROUGHPUT_OPTIMIZED preset makes (the preset
also turns on direct ingress, which drops Serve's HTTP proxy that `kiln serve` listens through):
the proxy and the replica export their cached Ray metrics once a second instead of ten times
(RAY_SERVE_METRICS_EXPORT_INTERVAL_MS; Ray's Serve metrics lag by at most a second, Kiln's own
/metrics not at all), and the proxy routes requests on its own event loop instead of a second
loop in another thread (RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP: one thread fewer waking, no
cross-thread hand-over per request). With them (and buffered request logs, not kept) an idle
tree took 0.044 cores against 0.062-0.071 before, in the same 10 s measurement on a busy machine."""

from __future__ import annotations

import os

IDLE_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}


def quiet_idle_ray() -> None:
    """Set IDLE_ENV's defaults in this process's environment, before Ray starts."""
    for name, value in IDLE_ENV.items():
        os.environ.setdefault(name, value)
