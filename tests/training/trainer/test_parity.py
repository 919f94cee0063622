"""Every layout's loss after 2 optimizer steps equals the single-process run (fp32, within 1e-5).

Spawning ranks is the expensive part, so one 2-rank process group trains all 2-rank layouts in
turn, and one 8-rank group trains tp2 x pp2 x dp_shard2 and HSDP (dp_replicate2 x dp_shard2) x tp2.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.training.distributed import run_distributed
from tests.training.trainer.layouts import run_layouts, train_losses

TWO_RANKS = {
    "dp_shard2_distributed_optimizer": {
        "parallel": {"dp_shard": 2, "reshard_after_forward": False}
    },
    "dp_shard2_zero3": {"parallel": {"dp_shard": 2, "reshard_after_forward": True}},
    "dp_replicate2": {"parallel": {"dp_replicate": 2, "dp_shard": 1}},
    "tp2_sp": {"parallel": {"tp": 2, "dp_shard": 1}},
    "pp2_gpipe": {"parallel": {"pp": 2, "dp_shard": 1, "pp_schedule": "gpipe"}},
    "pp2_1f1b": {"parallel": {"pp": 2, "dp_shard": 1, "pp_schedule": "1f1b"}},
    "pp2_interleaved_1f1b": {
        "parallel": {
            "pp": 2,
            "dp_shard": 1,
            "pp_schedule": "interleaved_1f1b",
            "pp_virtual_stages": 2,
        }
    },
    "pp2_zbv": {"parallel": {"pp": 2, "dp_shard": 1, "pp_schedule": "zbv"}},
    "recompute_selective_op": {"parallel": {"dp_shard": 2}, "recompute": "selective"},
    "recompute_selective_attention": {
        "parallel": {"dp_shard": 2},
        "recompute": "selective",
        "selective_recompute": "attention",
    },
    "recompute_full": {"parallel": {"dp_shard": 2}, "recompute": "full"},
    "activation_offload": {"parallel": {"dp_shard": 2}, "activation_offload": True},
    "optimizer_offload": {"parallel": {"dp_shard": 2}, "optimizer_offload": True},
    "bf16_dp_shard2": {"parallel": {"dp_shard": 2}, "precision": "bf16"},
}
EIGHT_RANKS = {
    "tp2_pp2_dp_shard2": {"parallel": {"tp": 2, "pp": 2, "dp_shard": 2}},
    "hsdp_dp_replicate2_dp_shard2_tp2": {"parallel": {"dp_replicate": 2, "dp_shard": 2, "tp": 2}},
}


@pytest.fixture(scope="module")
def _runs() -> tuple[list[float], dict[str, list[float]]]:
    # The single-process reference trains in a thread while the two ranks start and sync
    # (their forkserver start and gloo waits leave a core idle).
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(train_losses)
        per_rank = run_distributed(run_layouts, 2, list(TWO_RANKS.values()), timeout=600)
        ref = reference.result()
    assert per_rank[0] == per_rank[1], "every rank reports the same global loss"
    return ref, dict(zip(TWO_RANKS, per_rank[0], strict=False))


@pytest.fixture(scope="module")
def reference(_runs) -> list[float]:
    return _runs[0]


@pytest.fixture(scope="module")
def two_rank_losses(_runs) -> dict[str, list[float]]:
    return _runs[1]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [k for k in TWO_RANKS if not k.startswith("bf16")])
def test_two_rank_layout_matches_single_process(layout, reference, two_rank_losses):
    assert two_rank_losses[layout] == pytest.approx(reference, abs=1e-5)


@pytest.mark.slow
def test_bf16_distributed_stays_near_fp32(reference, two_rank_losses):
    # FSDP2 MixedPrecisionPolicy: bf16 compute, fp32 master weights and gradient reduction.
    assert two_rank_losses["bf16_dp_shard2"] == pytest.approx(reference, abs=3e-2)
    assert two_rank_losses["bf16_dp_shard2"] != pytest.approx(
        reference, abs=1e-6
    )  # really ran bf16


@pytest.mark.slow
def test_eight_rank_layouts(reference):
    per_rank = run_distributed(run_layouts, 8, list(EIGHT_RANKS.values()), timeout=600)
    assert all(r == per_rank[0] for r in per_rank)
    for name, losses in zip(EIGHT_RANKS, per_rank[0], strict=False):
        assert losses == pytest.approx(reference, abs=1e-5), name
