"""Continuous batching: iteration-level scheduling over a fixed pool of KV-cache slots.

`Engine` (loop.py) runs the step loop on a background thread; `Scheduler` (scheduler.py) decides
admission, chunked prefill and decode rows; `SlotPool` (slots.py) holds the cache; aio.py feeds
per-request asyncio queues. See docs/serving.md, "Continuous batching".
"""

from kiln.engine.aio import complete, stream_events
from kiln.engine.engine import Engine, EngineStopped
from kiln.engine.request import EngineEvent, EngineRequest

__all__ = ["Engine", "EngineEvent", "EngineRequest", "EngineStopped", "complete", "stream_events"]
