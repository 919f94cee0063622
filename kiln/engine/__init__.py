"""Continuous batching: iteration-level scheduling over a paged KV cache with automatic prefix
caching.

`Engine` (engine.py) runs the step loop on a background thread; `Scheduler` (scheduler.py) decides
admissions, prompt chunks, decode rows and preemptions within a token budget; `KVCacheManager`
(kv_cache_manager.py, over block_pool.py and prefix_hash.py) says which blocks of the paged
cache (kiln/model/paged_kv_cache.py) each sequence holds and which prefixes are cached; aio.py
feeds per-request asyncio queues. See docs/serving.md, "Continuous batching".
"""

from kiln.engine.aio import complete, stream_events
from kiln.engine.engine import Engine, EngineStopped
from kiln.engine.request import EngineEvent, EngineRequest

__all__ = ["Engine", "EngineEvent", "EngineRequest", "EngineStopped", "complete", "stream_events"]
