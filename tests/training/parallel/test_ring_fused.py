"""Ring attention on aten's fused flash kernel (blocks return their log-sum-exp) and on the
fp32 matmul path both equal SDPA within 1e-5 in fp32, forward and backward."""

from __future__ import annotations

import pytest

from tests.training.distributed import run_distributed
from tests.training.parallel._ring_cases import ring_vs_sdpa


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "matmul"])
def test_ring_block_kernels_match_sdpa_on_two_ranks(fused):
    for errors in run_distributed(ring_vs_sdpa, 2, fused):
        assert len(errors) >= 5
        for case, err in errors:
            assert err < 1e-5, (case, err)
