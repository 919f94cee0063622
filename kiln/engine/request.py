"""One request inside the engine: its tokens, where it stands, and how to tell its caller."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kiln.engine.sequence import Sequence

_ids = itertools.count()


@dataclass
class EngineEvent:
    """What a request's listener receives: a new token, its end, or its own error."""

    kind: Literal["token", "finish", "error"]
    token_ids: list[int]  # the completion so far (a copy)
    finish_reason: str | None = None
    text: str | None = None  # set on finish when a stop string cut the text
    error: BaseException | None = None


Listener = Callable[[EngineEvent], None]


@dataclass(eq=False)
class EngineRequest:
    """A `Sequence` (prompt, params, rng, tokens, finish reason) plus
    its slot, how much of the prompt is cached, and the listener called from the engine thread."""

    seq: Sequence
    listener: Listener
    id: int = field(default_factory=lambda: next(_ids))
    slot: int | None = None
    prefilled: int = 0  # prompt tokens already in the cache
    cancelled: bool = False
    failed: bool = False
    error: BaseException | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.seq.prompt_ids

    @property
    def prefill_left(self) -> int:
        return len(self.seq.prompt_ids) - self.prefilled

    @property
    def finished(self) -> bool:
        return self.seq.done or self.cancelled or self.failed

    def emit(self, kind: Literal["token", "finish"]) -> None:
        seq = self.seq
        self._tell(EngineEvent(kind, list(seq.token_ids), seq.finish_reason, seq.text))

    def fail(self, error: BaseException) -> None:
        self.failed = True
        self.error = error
        self._tell(EngineEvent("error", list(self.seq.token_ids), error=error))

    def _tell(self, event: EngineEvent) -> None:
        try:
            self.listener(event)
        except Exception:  # noqa: BLE001 - a listener that cannot hear (closed loop) cancels
            self.cancelled = True
