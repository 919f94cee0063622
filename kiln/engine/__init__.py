"""Continuous batching: iteration-level scheduling over a paged KV cache with automatic prefix
caching.

`Engine` (engine.py) runs the step loop on a background thread; `Scheduler` (scheduler.py) decides
admissions, prompt chunks, decode rows and preemptions within a token budget; `KVCacheManager`
(kv_cache_manager.py, over block_pool.py and prefix_hash.py) says which blocks of the paged
cache (kiln/model/paged_kv_cache.py) each sequence holds and which prefixes are cached;
model_runner.py calls `Transformer.forward`; aio.py feeds per-request asyncio queues. See
docs/serving.md, "Continuous batching".
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
