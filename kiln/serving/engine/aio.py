"""The engine from asyncio: each request's events go to its own asyncio.Queue, handed over from
the engine thread with `call_soon_threadsafe`; the event loop never waits on torch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kiln.serving.engine.loop import Engine
from kiln.serving.engine.request import EngineEvent
from kiln.serving.sampling import SamplingParams


async def stream_events(
    engine: Engine, prompt_ids: list[int], params: SamplingParams
) -> AsyncIterator[EngineEvent]:
    """Yield the request's token events, then its finish event; its error is raised here.
    Leaving early (a client that went away) cancels the request and frees its slot."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def listener(event: EngineEvent) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    request = engine.submit(prompt_ids, params, listener)
    try:
        while True:
            event = await events.get()
            if event.kind == "error":
                raise event.error  # type: ignore[misc]
            yield event
            if event.kind == "finish":
                return
    finally:
        engine.cancel(request)  # a no-op once it finished


async def complete(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> EngineEvent:
    """The finish event of one request (its error raised)."""
    async for event in stream_events(engine, prompt_ids, params):
        if event.kind == "finish":
            return event
    raise RuntimeError("engine stream ended without a finish event")
