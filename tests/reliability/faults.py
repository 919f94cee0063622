"""Fault hooks loaded on the Ray workers through `ray.callbacks` (module:function)."""

from __future__ import annotations

import os
import signal
import time

from kiln.curator.filters.base import DocumentFilter

PAUSE_STEP = 2  # on 2 workers: the test removes the worker node here
REGROW_STEP = 2  # on the 1 worker left (step 2 again): the test brings the node back here
SMALL_WORLD = 1
NODE_REMOVED = "node-removed"
NODE_BACK = "node-back"


def pause_for_node_changes(metrics: dict, info: dict) -> None:
    """Every rank stops once at PAUSE_STEP until the test has removed the worker node, and (on
    the smaller layout) once at REGROW_STEP until the node is back, so each change happens at a
    known step however loaded the machine is."""
    small = metrics["world_size"] == SMALL_WORLD
    if metrics["step"] == PAUSE_STEP and not small:
        _pause(info, "paused", NODE_REMOVED)
    elif metrics["step"] == REGROW_STEP and small:
        _pause(info, "shrunk", NODE_BACK)


def _pause(info: dict, tag: str, until: str) -> None:
    run_dir = info["run_dir"]
    done = os.path.join(run_dir, until)
    if os.path.exists(done):
        return
    with open(os.path.join(run_dir, f"{tag}-rank{info['rank']}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 300
    while not os.path.exists(done) and time.monotonic() < deadline:
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


def fail_on_init_marker() -> str:
    """Armed by the test (created), disarmed by the first process that removes it: one per Ray
    job, so the driver and its actors name the same file."""
    import tempfile

    import ray

    job = ray.get_runtime_context().get_job_id()
    return os.path.join(tempfile.gettempdir(), f"kiln-fail-on-init-{job}")


class FailOnInitOnce(DocumentFilter):
    """A curator filter that keeps every document; while the job's marker is armed, the first
    Ray actor to build it fails in its constructor: an actor that dies while it starts, which Ray
    Core does not restart (a SIGKILL there would be restarted by Ray Core itself)."""

    name = "fail_on_init_once"

    def __init__(self) -> None:
        import ray

        if ray.is_initialized() and ray.get_runtime_context().get_actor_id():  # actors only
            try:
                os.remove(fail_on_init_marker())  # only one process wins this
            except FileNotFoundError:
                return
            raise RuntimeError("fail_on_init_once: this actor dies while it starts")

    def keep(self, batch):
        import numpy as np

        return np.ones(len(batch), dtype=bool)


PAUSE_TAG = "kiln-pause-on-worker-node:"


class PauseOnWorkerNode(DocumentFilter):
    """A curator filter that keeps every document, except that a process on the test cluster's
    worker node (`KILN_TEST_NODE=worker`) which sees `kiln-pause-on-worker-node:<marker>` writes
    the marker and waits there, so the test kills the node with a task known to be in flight.
    On the head node the same document waits for that marker (bounded): an actor there that is
    ready first would otherwise run every task before the worker node's actor takes one."""

    name = "pause_on_worker_node"

    def keep(self, batch):
        import numpy as np

        node = os.environ.get("KILN_TEST_NODE")
        for text in batch.texts if node in ("worker", "head") else ():
            if PAUSE_TAG not in text:
                continue
            marker = text.split(PAUSE_TAG, 1)[1].split()[0]
            if node == "worker":
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
            deadline = time.monotonic() + (300 if node == "worker" else 120)
            # the worker node: until the node is killed; the head: until the worker node pauses
            while time.monotonic() < deadline and (node == "worker" or not os.path.exists(marker)):
                time.sleep(0.1)
        return np.ones(len(batch), dtype=bool)


DRIVER_KILL_STEP = 3


def pause_first_attempt(metrics: dict, info: dict) -> None:
    """A run that did not resume from a checkpoint stops at DRIVER_KILL_STEP (every rank) until
    the test kills its driver; a resumed run goes through."""
    if metrics["step"] != DRIVER_KILL_STEP or info["resumed_from"]:
        return
    with open(os.path.join(info["run_dir"], f"paused-rank{info['rank']}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until the driver's death takes this worker down
        time.sleep(0.1)
