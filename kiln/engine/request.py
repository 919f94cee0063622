"""One request inside the engine: its tokens, where it stands, and how to tell its caller."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kiln.engine.block_pool import KVBlock
from kiln.engine.lora_adapter import LoRAAdapter
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
    """A `Sequence` (prompt, params, rng, tokens, finish reason) plus the KV blocks it holds,
    how many of its tokens are computed (keys/values cached), and the listener called from the
    engine thread. Its tokens are the prompt and the completion so far: a step computes the
    ones not computed yet (a prompt chunk, the last sampled token, or, after a preemption, all
    of them again) and samples when it reaches the last."""

    seq: Sequence
    listener: Listener
    id: int = field(default_factory=lambda: next(_ids))
    cache_salt: str | None = None  # keeps this request's cached prefixes apart from others'
    lora: LoRAAdapter | None = None  # the adapter its forwards add (None: the base model)
    blocks: list[KVBlock] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of its full blocks, chained
    computed: int = 0  # tokens whose keys/values are in its blocks
    cancelled: bool = False
    failed: bool = False
    error: BaseException | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self.seq.prompt_ids

    @property
    def num_tokens(self) -> int:
        return len(self.seq.prompt_ids) + len(self.seq.token_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.seq.prompt_ids + self.seq.token_ids

    @property
    def uncomputed(self) -> int:
        return self.num_tokens - self.computed

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
