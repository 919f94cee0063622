"""The KVCache contract a continuous-batching engine relies on: rows at different lengths share
one step, a row is reset for a new sequence mid-flight, ragged steps are right-padded then
truncated, and every row's logits equal the uncached forward of that row's tokens alone."""

from __future__ import annotations

import pytest
import torch

from kiln.model import KVCache
from tests.engine.tiny import SHAPES, tiny_model


def _alone(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0, -1]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_rows_join_and_leave_a_shared_cache(shape):
    model = tiny_model(shape, vocab_size=64)
    torch.manual_seed(1)
    seqs = [torch.randint(0, 64, (n,)).tolist() for n in (9, 4)]
    cache = KVCache.for_model(model.cfg, batch=2, max_len=40)
    with torch.no_grad():
        # ragged prefill: row 1 right-padded to row 0's length
        tokens = torch.zeros(2, 9, dtype=torch.long)
        for row, seq in enumerate(seqs):
            tokens[row, : len(seq)] = torch.tensor(seq)
        model(tokens, kv_cache=cache)
        cache.truncate(torch.tensor([9, 4]))
        for _ in range(3):  # shared decode steps at different lengths
            step = torch.randint(0, 64, (2, 1))
            logits = model(step, kv_cache=cache)[:, -1]
            for row in range(2):
                seqs[row].append(int(step[row]))
                torch.testing.assert_close(logits[row], _alone(model, seqs[row]), atol=1e-5, rtol=0)
        # row 1 finishes; a new 5-token prompt starts there while row 0 decodes one token
        cache.reset(torch.tensor([1]))
        seqs[1] = torch.randint(0, 64, (5,)).tolist()
        seqs[0].append(7)
        tokens = torch.tensor([[7, 0, 0, 0, 0], seqs[1]])
        logits = model(tokens, kv_cache=cache)
        cache.truncate(torch.tensor([len(seqs[0]), 5]))
        torch.testing.assert_close(logits[0, 0], _alone(model, seqs[0]), atol=1e-5, rtol=0)
        torch.testing.assert_close(logits[1, 4], _alone(model, seqs[1]), atol=1e-5, rtol=0)
        # row 0 leaves the batch; row 1 goes on alone
        cache.keep_rows(torch.tensor([1]))
        logits = model(torch.tensor([[3]]), kv_cache=cache)[0, -1]
        torch.testing.assert_close(logits, _alone(model, [*seqs[1], 3]), atol=1e-5, rtol=0)


def test_a_full_cache_is_an_error():
    model = tiny_model("llama", vocab_size=64)
    cache = KVCache.for_model(model.cfg, batch=1, max_len=4)
    with pytest.raises(ValueError, match="full"), torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)
