"""A training worker's error as the one line a user reads, its traceback kept in the run log.

Ray Train reports a failed worker group as a `WorkerGroupError` whose text is every rank's
traceback; the exception each rank raised travels with it. A KilnError (a config mistake the
trainer found) is re-raised as itself; anything else becomes one line naming the rank, the
error and where the traceback is.
"""

from __future__ import annotations

import logging
import os

from kiln.platform import console
from kiln.platform.errors import KilnError, StageFailed

log = logging.getLogger("kiln.train")


def worker_error(exc: Exception, run_dir: str) -> Exception:
    """The exception to raise in the driver for Ray Train's `exc` (see the module docstring)."""
    failures = getattr(exc, "worker_failures", None) or {}
    raised = {f"rank {r}": getattr(err, "_base_exc", err) for r, err in sorted(failures.items())}
    if getattr(exc, "controller_failure", None) is not None:  # Ray Train's ControllerError
        raised["Ray Train's controller"] = exc.controller_failure
    for err in raised.values():
        if isinstance(err, KilnError):
            log.debug("training failed:\n%s", exc)
            return err
    where = _keep_traceback(exc, run_dir)
    who, err = next(iter(raised.items()), ("Ray Train", exc))  # the lowest rank first
    return StageFailed(
        f"training failed on {who}: {type(err).__name__}: {_first_line(err)} (see {where})"
    )


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else "(no message)"


def _keep_traceback(exc: Exception, run_dir: str) -> str:
    """The run log when one is attached (it takes the traceback), else a file in `run_dir`."""
    run_log = console.run_log_path()
    if run_log is not None:
        log.debug("training failed:\n%s", exc)
        return str(run_log)
    path = os.path.join(run_dir, "worker-error.txt")
    os.makedirs(run_dir, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{exc}\n")
    return path
