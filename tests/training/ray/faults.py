"""Fault injection for the Ray tests, loaded on each worker through `ray.callbacks`."""

from __future__ import annotations

import os
import signal


def kill_rank1_once_at_step_5(metrics: dict, info: dict) -> None:
    """SIGKILL worker rank 1 after step 5, once per run (a marker file remembers)."""
    marker = os.path.join(info["run_dir"], "killed-at-step-5")
    if info["rank"] == 1 and metrics["step"] == 5 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
