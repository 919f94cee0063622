"""Stop cleanly on SIGINT and SIGTERM, whatever signal dispositions the process inherited.

A shell that runs a command in the background (`cmd &`, non-interactive) starts it with SIGINT
ignored, so relying on Python's default SIGINT handler means Ctrl-C / `kill -INT` silently does
nothing there. Long-running commands (`kiln run`, `kiln train`, `kiln triton up`) install this
explicitly. Either signal raises `Interrupted` in the main thread; the command exits with the
shell's status for it (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import signal
import threading

_received: list[int] = []  # signals taken by the handler, in order


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the work stopped where it was (a re-run resumes it)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    def __reduce__(self):
        return (type(self), (self.signum,))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code(exc: KeyboardInterrupt) -> int:
    """The shell's exit status for an interruption (130: Ctrl-C, as Python's own)."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def received() -> int | None:
    """The first signal this process was stopped by, or None. Code that catches
    KeyboardInterrupt and raises something else (a library's cleanup) hides it; this does not."""
    return _received[0] if _received else None


def as_interruption(exc: BaseException) -> Interrupted | None:
    """`exc` as the interruption it is or was caused by, else None."""
    if isinstance(exc, Interrupted):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted(received() or signal.SIGINT)
    if received() is not None:
        return Interrupted(received())
    return None


def _interrupt(signum, frame):
    _received.append(signum)
    raise Interrupted(signum)


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread (no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
