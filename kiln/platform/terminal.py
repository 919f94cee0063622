"""What the terminal is showing now, shared by the console's log handlers and the progress bars:
whether `-v` was given, and the live bars a log line must be written around."""

from __future__ import annotations

state = {"verbose": False}
live_bars: list = []  # tqdm bars on the terminal now (a log line clears and redraws them)


def verbose() -> bool:
    return state["verbose"]
