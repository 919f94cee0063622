"""Continuous batching: iteration-level scheduling over a fixed pool of KV-cache slots.

`Engine` (engine.py) runs the step loop on a background thread; `Scheduler` (scheduler.py)
decides admission, chunked prefill and decode rows; `SlotPool` (kv_cache_manager.py) holds the
cache; model_runner.py calls `Transformer.forward`; aio.py feeds per-request asyncio queues.
See docs/serving.md, "Continuous batching".
"""

from kiln.platform.imports import lazy_exports

EXPORTS = {
    "Engine": "kiln.engine.engine:Engine",
    "EngineEvent": "kiln.engine.request:EngineEvent",
    "EngineRequest": "kiln.engine.request:EngineRequest",
    "EngineStopped": "kiln.engine.engine:EngineStopped",
    "complete": "kiln.engine.aio:complete",
    "stream_events": "kiln.engine.aio:stream_events",
}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = [*EXPORTS]
