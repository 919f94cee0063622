"""What Ray Train is told about a run, reported off the step loop.

`ray.train.report` is a barrier across the workers (an actor round trip) and hands the report to
a queue of one that Ray Train's controller empties on its health-check poll (every ~2 s): called
every step, it held each step for up to 2 s. So the step loop never calls it. A thread on every
worker does, when rank 0's thread says so: after rank 0 committed a checkpoint Ray Train has not
seen (it must, for its restarts), at least every `heartbeat_s` with the latest metrics, and once
at the end with the final metrics. Rank 0 tells the others over a gloo group of their own (one int
per report), so every worker calls `ray.train.report` the same number of times, in the same
order, as Ray Train requires. Per-step metrics stay local (`kiln.training.metrics_log`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kiln.train")

POINTER_FILE = "kiln_checkpoint.json"
_REPORT, _FINAL = 1, 2


class RayReporter:
    """One per worker; `update(metrics)` after each step (free), `finish(metrics)` at the end."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        committed: Callable[[], tuple[int, str] | None],
        heartbeat_s: float = 30.0,
        poll_s: float = 0.2,
    ) -> None:
        """`committed`: rank 0's newest complete checkpoint as (step, folder), or None."""
        import torch.distributed as dist

        self.rank, self.committed = rank, committed
        self.heartbeat_s, self.poll_s = heartbeat_s, poll_s
        # Every rank creates the group at the same point (before the trainer builds its own).
        self._group = dist.new_group(backend="gloo") if world_size > 1 else None
        self._latest: dict[str, Any] = {}
        self._reported: str | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.reports = 0
        target = self._lead if rank == 0 else self._follow
        self._thread = threading.Thread(target=self._guard, args=(target,), daemon=True)
        self._thread.name = "kiln-ray-report"
        self._thread.start()

    def update(self, metrics: dict[str, Any]) -> None:
        """Remember the latest metrics; raise here if a report failed (the worker then fails)."""
        if self._error is not None:
            raise self._error
        self._latest = metrics

    def finish(self, metrics: dict[str, Any]) -> None:
        """The final report (with the last committed checkpoint); returns once it is made."""
        self._latest = metrics
        self._done.set()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
            self._error = e

    def _lead(self) -> None:
        """Rank 0: report when there is a new checkpoint, a heartbeat is due, or at the end."""
        last = time.monotonic()
        while True:
            final = self._done.wait(self.poll_s)
            newest = self.committed()
            fresh = newest is not None and newest[1] != self._reported
            if not (final or fresh or time.monotonic() - last >= self.heartbeat_s):
                continue
            self._signal(_FINAL if final else _REPORT)
            # the final report names the newest checkpoint even when an earlier report did (the
            # last save can be committed and reported just before the loop ends): Ray Train's
            # result for the run is its latest checkpoint's report, and that must be the final one
            self._report(newest[1] if fresh or (final and newest) else None, final)
            last = time.monotonic()
            if final:
                return

    def _follow(self) -> None:
        """Other ranks: report whenever rank 0 does (Ray Train's report is a barrier)."""
        import torch
        import torch.distributed as dist

        flag = torch.zeros(1, dtype=torch.int32)
        while True:
            dist.broadcast(flag, src=0, group=self._group)
            final = int(flag.item()) == _FINAL
            self._report(None, final)
            if final:
                return

    def _signal(self, kind: int) -> None:
        if self._group is None:
            return
        import torch
        import torch.distributed as dist

        dist.broadcast(torch.tensor([kind], dtype=torch.int32), src=0, group=self._group)

    def _report(self, checkpoint_dir: str | None, final: bool) -> None:
        import ray.train

        metrics = {
            k: v
            for k, v in self._latest.items()
            if isinstance(v, int | float | str | bool) or v is None
        }
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint, mode = None, ray.train.CheckpointUploadMode.NO_UPLOAD
            if checkpoint_dir is not None:
                checkpoint, mode = _ray_checkpoint(checkpoint_dir, tmp)
            ray.train.report(
                {**metrics, "final": final}, checkpoint=checkpoint, checkpoint_upload_mode=mode
            )
        if checkpoint_dir is not None:
            self._reported = checkpoint_dir
        self.reports += 1


def _ray_checkpoint(ckpt_dir: str, tmp: str):
    """A pointer checkpoint (one small JSON naming the DCP folder), which Ray copies into its own
    storage. Never the DCP folder itself: kiln prunes those (`keep_last`), and a run snapshot
    naming a folder that is gone makes Ray Train refuse to resume the run by name."""
    import ray.train

    with open(os.path.join(tmp, POINTER_FILE), "w") as f:
        json.dump({"uri": ckpt_dir}, f)
    return ray.train.Checkpoint.from_directory(tmp), ray.train.CheckpointUploadMode.SYNC


def route_ray_train_log(run_dir: str, rank: int) -> str:
    """Ray Train's worker-side context logger says "Reporting training result ..." for every
    report: send it to `<run_dir>/logs/ray-train-rank<N>.log`; only its warnings reach the console.

    That logger is named after its source file (`logging.getLogger(__file__)`), so it is looked up
    through the module rather than by a dotted name.
    """
    from ray.train.v2._internal.execution import context

    folder = os.path.join(run_dir, "logs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"ray-train-rank{rank}.log")
    ray_log = logging.getLogger(context.__file__)
    for handler in list(ray_log.handlers):  # a restarted worker process configures again
        ray_log.removeHandler(handler)
        handler.close()
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    to_console = logging.StreamHandler()
    to_console.setLevel(logging.WARNING)
    ray_log.addHandler(to_file)
    ray_log.addHandler(to_console)
    ray_log.setLevel(logging.INFO)
    ray_log.propagate = False
    return path
