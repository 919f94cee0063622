"""PagedKVCache through `Transformer.forward`: rows whose blocks are scattered over the pool (and
share a prefix block) give the logits of contiguous `KVCache` rows, step after step."""

from __future__ import annotations

import pytest
import torch

from kiln.model import KVCache
from kiln.model.paged_kv_cache import NULL_BLOCK, PagedKVCache
from tests.engine.conftest import one_torch_thread  # noqa: F401 - autouse: one torch thread
from tests.engine.tiny import tiny_model


@pytest.mark.parametrize("shape", ["llama", "mistral"])
def test_paged_rows_equal_contiguous_rows(shape):
    model = tiny_model(shape, 60)
    torch.manual_seed(1)
    shared = torch.randint(0, 60, (4,))
    prompts = [torch.cat([shared, torch.randint(0, 60, (n,))]) for n in (5, 9)]
    paged = PagedKVCache.for_model(model.cfg, num_blocks=12, block_size=4)
    # row 0 owns blocks 7, 2, 9 after the shared block 5; row 1 owns 3, 11, 4, 8
    tables = [[5, 7, 2, 9, 10], [5, 3, 11, 4, 8]]
    with torch.inference_mode():
        model(shared[None], kv_cache=paged.batch([[5]], [0], 4))  # the shared prefix, once
        logits = []
        for row, prompt in enumerate(prompts):  # each prompt's own tokens after the prefix
            batch = paged.batch([tables[row]], [4], len(prompt) - 4)
            logits.append(model(prompt[None, 4:], kv_cache=batch)[0, -1])
        for _ in range(3):  # decode both rows together: [2, 1] tokens, rows at their lengths
            tokens = torch.stack([lg.argmax() for lg in logits])[:, None]
            lengths = [len(p) for p in prompts]
            logits = list(model(tokens, kv_cache=paged.batch(tables, lengths, 1))[:, -1])
            prompts = [torch.cat([p, t]) for p, t in zip(prompts, tokens, strict=True)]
        for prompt, got in zip(prompts, logits, strict=True):
            cache = KVCache.for_model(model.cfg, 1, 32)
            want = model(prompt[None], kv_cache=cache)[0, -1]  # one contiguous row
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_pads_past_a_rows_blocks_go_to_the_null_block_and_storage_is_zeroed_as_used():
    model = tiny_model("llama", 60)
    paged = PagedKVCache.for_model(model.cfg, num_blocks=64, block_size=4)
    assert paged.zeroed == 8  # the first doubling step only
    batch = paged.batch([[1], [2, 3]], [0, 0], 6)  # row 0 holds 4 slots: 2 pads spill
    slots = batch.write_slots.view(2, 6)
    assert slots[0].tolist() == [4, 5, 6, 7, NULL_BLOCK * 4 + 0, NULL_BLOCK * 4 + 1]
    assert slots[1].tolist() == [8, 9, 10, 11, 12, 13]
    paged.batch([[40]], [0], 1)
    assert paged.zeroed == 41 and all(bool(t[:41].isfinite().all()) for t in paged.k + paged.v)
