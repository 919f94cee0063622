"""SlotPool.swap: the engine packs decoding rows to the front by swapping whole slots."""

from __future__ import annotations

import torch

from kiln.serving.engine.slots import SlotPool
from tests.serving.generate.tiny import tiny_model


def test_swap_exchanges_keys_values_lengths_and_free_state():
    pool = SlotPool(tiny_model("llama", 50).cfg, 4, 16)
    a, b = pool.acquire(), pool.acquire()  # 0, 1; slots 2 and 3 stay free
    for t in pool.cache.k + pool.cache.v:
        t[a].fill_(1.0)
        t[b, :, :3].fill_(2.0)
    pool.lengths[a], pool.lengths[b] = 5, 3
    pool.swap(a, b)
    assert pool.lengths[:2] == [3, 5]
    for t in pool.cache.k + pool.cache.v:
        assert bool((t[a, :, :3] == 2.0).all()) and bool((t[b, :, :5] == 1.0).all())
    pool.swap(b, 3)  # a busy row into a free slot: slot 1 is free now, 3 holds the row
    assert pool.lengths[3] == 5 and pool.lengths[1] == 0
    assert sorted(pool._free) == [1, 2]
    assert pool.acquire() == 1
    for t in pool.cache.k:
        torch.testing.assert_close(t[3, :, :5], torch.ones_like(t[3, :, :5]))
