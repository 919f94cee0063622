"""What a tritonserver's python-backend stubs do while the server starts, read from Linux /proc:
the backend's start deadlock (`DeadlockWatch`) and a stack dump of stubs that hang."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import time

from kiln.platform.errors import KilnError

# A server thread blocked in waitpid this long while models load: the python backend's deadlock
# (StubDeadlock); its only legitimate wait then, on `stub` run without arguments, takes ~0.1 s.
STUB_WAIT_DEADLOCK_S = 10.0


class StubDeadlock(KilnError):
    """The python backend judged a starting stub unhealthy (its health thread, which must tick
    within 1 s, was starved of CPU) and now waits for that stub to exit, which it never does: the
    server would hang in model loading for good. A busy machine starves the stubs of a server in
    a session (so a scheduler autogroup) of its own (docs/reliability.md); kiln starts it again."""


def _in_waitpid(server_pid: int) -> bool:
    """Whether a thread of the server is blocked in waitpid (its wchan)."""
    for wchan in glob.glob(f"/proc/{server_pid}/task/*/wchan"):
        with contextlib.suppress(OSError), open(wchan) as f:
            if f.read() == "do_wait":
                return True
    return False


class DeadlockWatch:
    """Called at each readiness poll: raises StubDeadlock, after SIGKILLing the server's process
    group (SIGTERM would wait on the stub too), once a server thread has been in waitpid for
    STUB_WAIT_DEADLOCK_S."""

    def __init__(self) -> None:
        self.waiting_since: float | None = None

    def check(self, server_pid: int) -> None:
        if not _in_waitpid(server_pid):
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()
        elif time.monotonic() - self.waiting_since > STUB_WAIT_DEADLOCK_S:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server_pid, signal.SIGKILL)
            raise StubDeadlock(
                f"tritonserver waited {STUB_WAIT_DEADLOCK_S:.0f} s for a python-backend stub "
                "it judged unhealthy to exit (a stub starved of CPU while starting)"
            )


def stub_pids(server_pid: int) -> list[int]:
    """The server's python-backend stubs: its children (of any of its threads) named so."""
    children = []
    for path in glob.glob(f"/proc/{server_pid}/task/*/children"):
        with contextlib.suppress(OSError), open(path) as f:
            children += [int(pid) for pid in f.read().split()]
    stubs = []
    for pid in children:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
            if f.read().startswith("triton_python"):
                stubs.append(pid)
    return stubs


def dump_stubs(server_pid: int) -> None:
    """SIGUSR1 to the server's python-backend stubs: each prints every thread's stack to the
    server log (model.py registers faulthandler for it), so a start that timed out says where a
    model's `initialize` hung."""
    stubs = stub_pids(server_pid)
    for pid in stubs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    if stubs:
        time.sleep(1.0)  # the dumps are written from the stubs' signal handlers
