"""What an idle `kiln serve` costs in Ray's background work, trimmed where Ray lets us.

Measured on an idle endpoint (psutil over the process tree, 15 s): 0.07 cores, of which Ray
Serve's controller took the largest share (0.02), because it reconciles every deployment ten
times a second (RAY_SERVE_CONTROL_LOOP_INTERVAL_S, 0.1 s). Once a second is enough for an
endpoint whose replicas change only when it is deployed, scaled or a replica dies; requests never
pass through the controller. The rest (GCS, raylet, the proxy's and replica's own event loops,
the dashboard agent) has no setting. The variables reach the controller only through an embedded
Ray this process starts (its processes inherit our environment); a value the user set wins."""

from __future__ import annotations

import os

IDLE_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0"}


def quiet_idle_ray() -> None:
    """Set IDLE_ENV's defaults in this process's environment, before Ray starts."""
    for name, value in IDLE_ENV.items():
        os.environ.setdefault(name, value)
