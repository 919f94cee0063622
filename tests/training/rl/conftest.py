"""`kiln grpo` / `kiln distill` change glibc's malloc settings for their process
(malloc_tuning.py); tests call the handlers inside pytest's process, which keeps glibc's
defaults: the handlers' call is recorded here instead (`malloc_tuned` counts the calls)."""

import pytest

from kiln.training.rl import commands


@pytest.fixture(autouse=True)
def malloc_tuned(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(commands, "keep_freed_memory", lambda: calls.append(1) or True)
    return calls
