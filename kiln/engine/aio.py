"""The engine from asyncio: each request's events go to its own asyncio.Queue; the event loop
never waits on torch. Events from the engine thread are handed over in batches: a step emits one
event per running request, and one `call_soon_threadsafe` wake-up (a self-pipe write and a loop
iteration) per step instead of per token keeps the loop thread off the GIL the engine needs."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator

from kiln.engine.engine import Engine
from kiln.engine.request import EngineEvent
from kiln.engine.sampler import SamplingParams


class _Mailbox:
    """Events posted from any thread for queues of one event loop, delivered by one callback
    per batch: the first post schedules the delivery, later ones join it until it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, EngineEvent]] = []

    def post(self, queue: asyncio.Queue, event: EngineEvent) -> None:
        """Raises RuntimeError when the loop is closed (the engine then cancels the request)."""
        with self._lock:
            self._pending.append((queue, event))
            if len(self._pending) > 1:  # a delivery is already scheduled
                if self.loop.is_closed():
                    raise RuntimeError("event loop is closed")
                return
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self._lock:
                self._pending.clear()
            raise

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, event in pending:
            queue.put_nowait(event)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary()
)


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


async def stream_events(
    engine: Engine,
    prompt_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None = None,
    lora: str | None = None,
    *,
    coalesce: bool = False,
) -> AsyncIterator[EngineEvent]:
    """Yield the request's token events, then its finish event; its error is raised here.
    Leaving early (a client that went away) cancels the request and frees its slot. `lora`: the
    name of the LoRA adapter to decode with (None: the base model). `coalesce`: of the events
    waiting when the caller asks for the next, only the newest (each carries the completion so
    far), so tokens the caller fell behind on go out as one streamed chunk, not one each."""
    box = _mailbox(asyncio.get_running_loop())
    events: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def listener(event: EngineEvent) -> None:
        box.post(events, event)

    request = engine.submit(prompt_ids, params, listener, cache_salt=cache_salt, lora=lora)
    try:
        while True:
            event = await events.get()
            while coalesce and event.kind == "token" and not events.empty():
                event = events.get_nowait()
            if event.kind == "error":
                raise event.error  # type: ignore[misc]
            yield event
            if event.kind == "finish":
                return
    finally:
        engine.cancel(request)  # a no-op once it finished


async def complete(
    engine: Engine,
    prompt_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None = None,
    lora: str | None = None,
) -> EngineEvent:
    """The finish event of one request (its error raised)."""
    async for event in stream_events(engine, prompt_ids, params, cache_salt, lora):
        if event.kind == "finish":
            return event
    raise RuntimeError("engine stream ended without a finish event")
