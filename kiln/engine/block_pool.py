"""The KV blocks of the paged cache, as vLLM's v1 block pool: reference counts, the free queue
in eviction order, and the map from a full block's chained hash to the block that holds it.

A block whose last holder finished keeps its keys/values and its hash: it sits in the free
queue, still findable by hash, until a new allocation takes it from the head of the queue
(least recently freed first) and only then forgets its hash. So an unreferenced cached block
is evicted by LRU, and a referenced one never is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kiln.model.paged_kv_cache import NULL_BLOCK


@dataclass(eq=False)
class KVBlock:
    id: int
    ref_cnt: int = 0
    hash: bytes | None = None  # set while the block is findable as a cached full block


class BlockPool:
    """Blocks 1..num_blocks-1 (block 0 is the paged cache's null block, never handed out)."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # unreferenced blocks, head evicted first; cached ones among them stay findable
        self._free: OrderedDict[int, KVBlock] = OrderedDict(
            (b.id, b) for b in self.blocks if b.id != NULL_BLOCK
        )
        self._cached: dict[bytes, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        """Blocks a sequence can hold (the null block excluded)."""
        return len(self.blocks) - 1

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take now (unreferenced, cached or not)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def cached(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def take(self, n: int) -> list[KVBlock]:
        """`n` fresh blocks (each referenced once), evicting the least recently freed."""
        if n > len(self._free):
            raise ValueError(f"{n} KV blocks asked for, {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                del self._cached[block.hash]
                block.hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """One more reference to each (cache hits): an unreferenced one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.id]
            block.ref_cnt += 1

    def release(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference each; blocks nobody holds join the queue's tail in this order
        (so pass a sequence's blocks last first: its tail is evicted before its prefix)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.id] = block

    def cache(self, block: KVBlock, block_hash: bytes) -> None:
        """Make a computed full block findable by its hash (a block already cached under that
        hash keeps the entry; this one stays private to its sequence)."""
        if block.hash is None and block_hash not in self._cached:
            block.hash = block_hash
            self._cached[block_hash] = block

    def reset_cache(self) -> int:
        """Forget every cached hash (weights changed: the cached keys/values are stale)."""
        n = len(self._cached)
        for block in self._cached.values():
            block.hash = None
        self._cached.clear()
        return n
