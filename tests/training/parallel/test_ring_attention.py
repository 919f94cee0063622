"""Ring attention equals SDPA (forward and backward) on 2 and 4 gloo ranks."""

from __future__ import annotations

import pytest
import torch

from kiln.training.parallel.ring import local_positions, zigzag_shard
from tests.training.distributed import run_distributed
from tests.training.parallel._ring_cases import ring_vs_sdpa


def zigzag_unshard(shards: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Inverse of zigzag_shard: the full tensor from every rank's part (in rank order)."""
    halves = [s.chunk(2, dim) for s in shards]
    ordered = [h[0] for h in halves] + [h[1] for h in reversed(halves)]
    return torch.cat(ordered, dim)


def test_zigzag_roundtrip_and_positions():
    x = torch.arange(16).view(1, 16)
    shards = [zigzag_shard(x, 1, r, 4) for r in range(4)]
    assert shards[0].tolist() == [[0, 1, 14, 15]]
    assert shards[3].tolist() == [[6, 7, 8, 9]]
    assert torch.equal(zigzag_unshard(shards, 1), x)
    assert local_positions(4, 1, 4).tolist() == [2, 3, 12, 13]


@pytest.mark.slow
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_sdpa(cp):
    per_rank = run_distributed(ring_vs_sdpa, cp)
    for errors in per_rank:
        assert len(errors) >= 5
        for case, err in errors:
            assert err < 1e-5, (case, err)
