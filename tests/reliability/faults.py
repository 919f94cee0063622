"""Fault hooks loaded on the Ray workers through `ray.callbacks` (module:function)."""

from __future__ import annotations

import os
import time

PAUSE_STEP = 6
NODE_REMOVED = "node-removed"


def pause_until_node_removed(metrics: dict, info: dict) -> None:
    """Every rank stops after step PAUSE_STEP (once per run) until the test has removed the
    worker node, so the node dies at a known step however loaded the machine is."""
    run_dir = info["run_dir"]
    removed = os.path.join(run_dir, NODE_REMOVED)
    if metrics["step"] != PAUSE_STEP or os.path.exists(removed):
        return
    with open(os.path.join(run_dir, f"paused-rank{info['rank']}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 300
    while not os.path.exists(removed) and time.monotonic() < deadline:
        time.sleep(0.05)
