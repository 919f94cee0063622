"""Fault hooks loaded on the Ray workers through `ray.callbacks` (module:function)."""

from __future__ import annotations

import os
import signal
import time

from kiln.curator.filters.base import DocumentFilter

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


KILL_TAG = "kiln-kill-once:"


class KillWorkerOnce(DocumentFilter):
    """A curator filter (`filters.custom`) that keeps every document, except that the process
    which first sees a document containing `kiln-kill-once:<marker>` SIGKILLs itself (once: the
    marker file remembers). The marker travels in the data, so any worker, on any node, finds it."""

    name = "kill_worker_once"

    def keep(self, batch):
        import numpy as np

        for text in batch.texts:
            if KILL_TAG in text:
                marker = text.split(KILL_TAG, 1)[1].split()[0]
                if not os.path.exists(marker):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)
        return np.ones(len(batch), dtype=bool)
