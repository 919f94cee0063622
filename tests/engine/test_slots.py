"""SlotPool: rows grow on demand up to the context; the engine packs decoding rows to the front
by swapping whole slots."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.kv_cache_manager import SlotPool
from tests.engine.tiny import tiny_model


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


def test_rows_grow_by_doubling_keep_what_they_hold_and_stop_at_the_context(monkeypatch):
    from kiln.engine import kv_cache_manager as slots

    monkeypatch.setattr(slots, "FIRST_ROW_TOKENS", 4)
    pool = SlotPool(tiny_model("llama", 50).cfg, 2, 20)
    assert (pool.allocated, pool.max_len) == (4, 20)
    slot = pool.acquire()
    held = torch.arange(4.0)[:, None]  # position i holds i
    for t in pool.cache.k + pool.cache.v:
        t[slot].copy_(held.expand_as(t[slot]))
    pool.lengths[slot] = 4
    view = pool.view(slot, slot + 1, 1)  # a 5th token: the rows double to 8
    assert pool.allocated == 8 and view.max_len == 8 and view.k[0].shape[2] == 8
    pool.reserve(8)  # room enough: nothing moves
    assert pool.allocated == 8
    pool.reserve(13)
    assert pool.allocated == 16
    pool.reserve(17)  # doubling would pass the context: stops there
    assert pool.allocated == 20
    for t in pool.cache.k + pool.cache.v:
        assert t.shape[2] == 20
        torch.testing.assert_close(t[slot, :, :4], held.expand_as(t[slot, :, :4]))
        assert not t[slot, :, 4:].any() and not t[1 - slot].any()
    with pytest.raises(ValueError, match="needs 21 of 20"):
        pool.gather([slot], 17)
