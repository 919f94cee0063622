"""Which KV blocks each running sequence holds, as vLLM's v1 KV cache manager: prefix-cache
lookups, allocation for the tokens a step computes, caching of blocks once they are computed and
full, and freeing. Pure bookkeeping over a `BlockPool`; the keys/values live in the
`PagedKVCache` (kiln/model) the manager owns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.engine.block_pool import BlockPool, KVBlock
from kiln.engine.prefix_hash import extend_hashes
from kiln.engine.request import EngineRequest
from kiln.model.config import ModelConfig
from kiln.model.paged_kv_cache import PagedKVCache

DEFAULT_BLOCK_SIZE = 16
DEFAULT_MEMORY_CAP = 4 << 30  # bytes: vLLM-CPU's default KV cache space


@dataclass
class PrefixCacheStats:
    """Counted when a request is admitted (vLLM's prefix_cache_queries / _hits, in tokens)."""

    queries: int = 0
    hits: int = 0
    preemptions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def blocks_for(
    cfg: ModelConfig,
    max_seqs: int,
    max_len: int,
    block_size: int,
    dtype: torch.dtype,
    memory: int | None = None,
) -> int:
    """Blocks in the pool: `memory` bytes' worth when given, else enough for `max_seqs` full
    contexts up to DEFAULT_MEMORY_CAP; never fewer than one full context (a lone request must
    always fit), plus the null block."""
    per_block = PagedKVCache.bytes_per_block(cfg, block_size, dtype)
    context = -(-max_len // block_size)
    if memory is None:
        want = min(max_seqs * context, DEFAULT_MEMORY_CAP // per_block)
    else:
        want = memory // per_block
    return max(want, context) + 1


class KVCacheManager:
    def __init__(
        self,
        cache: PagedKVCache,
        *,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.cache = cache
        self.block_size = cache.block_size
        self.pool = BlockPool(cache.num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.stats = PrefixCacheStats()

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def usage(self) -> float:
        """Share of blocks held by running sequences (vLLM's kv_cache_usage_perc)."""
        total = self.pool.num_blocks
        return (total - self.pool.num_free) / total

    def hashes(self, request: EngineRequest, blocks: int) -> list[bytes]:
        """The chained hashes of the request's first `blocks` full blocks (computed once)."""
        if len(request.block_hashes) < blocks:
            tokens = request.all_ids[: blocks * self.block_size]
            extend_hashes(request.block_hashes, tokens, self.block_size, request.cache_salt)
        return request.block_hashes[:blocks]

    def cached_prefix(self, request: EngineRequest) -> list[KVBlock]:
        """The longest run of cached blocks that starts the request's tokens, leaving at least
        its last token to compute (its logits are needed)."""
        if not self.enable_prefix_caching:
            return []
        hit = []
        for block_hash in self.hashes(request, (request.num_tokens - 1) // self.block_size):
            block = self.pool.cached(block_hash)
            if block is None:
                break
            hit.append(block)
        return hit

    def allocate(self, request: EngineRequest, n: int, hit: list[KVBlock] = ()) -> bool:
        """Hold blocks for `n` more tokens of `request` (after its cache `hit`, for a request
        that holds none yet); False, holding nothing new, when the pool is short."""
        computed = request.computed + len(hit) * self.block_size
        need = -(-(computed + n) // self.block_size) - len(request.blocks) - len(hit)
        reviving = sum(1 for b in hit if b.ref_cnt == 0)  # hit blocks still in the free queue
        if need > self.pool.num_free - reviving:
            return False
        if hit:
            self.pool.touch(hit)
            request.blocks.extend(hit)
            request.computed = computed
        if need > 0:
            request.blocks.extend(self.pool.take(need))
        return True

    def count_admission(self, request: EngineRequest, hit: list[KVBlock]) -> None:
        self.stats.queries += request.num_tokens
        self.stats.hits += len(hit) * self.block_size

    def commit(self, request: EngineRequest, n: int) -> None:
        """`n` more tokens of the request are computed: blocks that became full are cached."""
        full_before = request.computed // self.block_size
        request.computed += n
        full = request.computed // self.block_size
        if self.enable_prefix_caching and full > full_before:
            hashes = self.hashes(request, full)
            for i in range(full_before, full):
                self.pool.cache(request.blocks[i], hashes[i])

    def inflight(self, requests: list[EngineRequest]) -> set[bytes]:
        """Hashes of full blocks these requests hold or will hold but have not computed yet (a
        request sharing one must wait until it is computed and cached)."""
        out: set[bytes] = set()
        if not self.enable_prefix_caching:
            return out
        for request in requests:
            first = request.computed // self.block_size
            last = request.num_tokens // self.block_size
            if last > first:
                out.update(self.hashes(request, last)[first:])
        return out

    def free(self, request: EngineRequest) -> None:
        """Release the request's blocks, tail first (evicted before the shared prefix)."""
        self.pool.release(reversed(request.blocks))
        request.blocks = []
        request.computed = 0

    def block_ids(self, request: EngineRequest) -> list[int]:
        return [b.id for b in request.blocks]

    def reset_prefix_cache(self) -> int:
        return self.pool.reset_cache()
