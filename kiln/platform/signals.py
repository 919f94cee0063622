"""Stop cleanly on SIGINT and SIGTERM, whatever signal dispositions the process inherited.

A shell that runs a command in the background (`cmd &`, non-interactive) starts it with SIGINT
ignored, so relying on Python's default SIGINT handler means Ctrl-C / `kill -INT` silently does
nothing there. Long-running commands (`kiln run`, `kiln triton up`) install this explicitly.
"""

from __future__ import annotations

import signal
import threading


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
