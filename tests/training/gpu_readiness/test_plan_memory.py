"""`kiln plan`'s per-rank memory: against a real run measured on CPU, and the figures it gives
for Llama-3 8B and 70B widths at several layouts on fake ranks."""

from __future__ import annotations

import pytest

from kiln.training.config import TrainConfig
from kiln.training.plan import cpu_stand_in, plan_rank, plan_step
from kiln.training.plan.moe import planned_counts
from tests.training.distributed import run_distributed
from tests.training.gpu_readiness._plan_cases import MOE, measured_peaks, small_config

GIB = 2**30


def _planned_peak(cfg: TrainConfig, world: int) -> int:
    return plan_step(cfg, 0, world)[1].peak  # bytes: these runs are ~0.01 GiB


RECOMPUTE = ["selective", "none", "full"]
FSDP = small_config("selective", {"dp_shard": 2})
MOE_EP2 = small_config("selective", {"dp_shard": 2, "ep": 2}, {**MOE, "capacity_factor": 1.25})


@pytest.fixture(scope="module")
def one_rank_peaks() -> dict[str, int]:
    """The three recompute modes measured one after another in one fresh process."""
    [peaks] = run_distributed(measured_peaks, 1, [small_config(r) for r in RECOMPUTE])
    return dict(zip(RECOMPUTE, peaks, strict=True))


@pytest.fixture(scope="module")
def two_rank_peaks() -> list[list[int]]:
    """Per rank: the FSDP run's peak, then the expert-parallel run's, on one 2-rank group."""
    return run_distributed(measured_peaks, 2, [FSDP, MOE_EP2])


@pytest.mark.slow  # real runs in a fresh process: ~10 s on the loaded 2-core machine
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_planned_peak_matches_a_measured_cpu_run(recompute, one_rank_peaks):
    measured = one_rank_peaks[recompute]
    planned = _planned_peak(small_config(recompute), 1)
    assert abs(planned - measured) / measured < 0.10, (planned, measured)


@pytest.mark.slow
def test_planned_peak_matches_a_measured_fsdp_rank(two_rank_peaks):
    measured = two_rank_peaks[0][0]
    planned = _planned_peak(FSDP, 2)
    assert abs(planned - measured) / measured < 0.10, (planned, measured)


LLAMA3_70B = {
    "dim": 8192,
    "n_heads": 64,
    "n_kv_heads": 8,
    "ffn_hidden_dim": 28672,
    "vocab_size": 128256,
}


@pytest.mark.parametrize(
    ("shape", "parallel"),
    [
        ({"preset": "llama3_8b"}, {"dp_shard": 64}),
        ({"preset": "llama3_8b"}, {"tp": 8, "dp_shard": 8}),
        ({"preset": "llama3_8b", **LLAMA3_70B}, {"tp": 8, "pp": 2, "dp_shard": 32}),
    ],
    ids=["8b-fsdp64", "8b-tp8-fsdp8", "70b-tp8-pp2-fsdp32"],
)
def test_llama3_widths_plan_their_states_and_activations(shape, parallel):
    """Full width, 2 layers (the per-layer figures scale with depth): the sharded fp32 weights,
    gradients and AdamW moments are 4 + 4 + 8 bytes per local parameter."""
    cfg = cpu_stand_in(
        TrainConfig(
            model={**shape, "n_layers": 2},
            parallel=parallel,
            seq_len=8192,
            global_batch_size=512,
            micro_batch_size=2 if parallel.get("pp") else 1,
            precision="bf16",
            recompute="selective",
        )
    )
    world = 1
    for degree in parallel.values():
        world *= degree
    info = plan_rank(cfg, 0, world)
    local_gib = info["local_params"] * 4 / GIB
    assert info["params_gib"] == pytest.approx(local_gib, abs=2e-3)
    assert info["grads_gib"] == pytest.approx(local_gib, abs=2e-3)
    assert info["optimizer_gib"] == pytest.approx(2 * local_gib, abs=2e-3)
    states = info["params_gib"] + info["grads_gib"] + info["optimizer_gib"]
    assert info["activations_gib"] > 0 and info["peak_gib"] >= states + info["activations_gib"]
    assert info["tokens_per_step"] == 512 * 8192


@pytest.mark.slow  # two real ranks: ~15 s on the loaded 2-core machine
def test_planned_moe_peak_matches_a_measured_expert_parallel_run(two_rank_peaks):
    """ep=2 with a capacity: the planner routes every owner at the capacity (the most it can
    receive), so it may sit above a measured run's routing, not below it."""
    measured = [per_rank[1] for per_rank in two_rank_peaks]
    for rank in (0, 1):
        planned = plan_step(MOE_EP2, rank, 2)[1].peak
        assert -0.02 < (planned - measured[rank]) / measured[rank] < 0.10, (planned, measured)


def test_planned_routing_counts():
    # 4096 tokens, top-2 of 8: 1024 rows per expert; capacity 1.25 -> an owner plans 1280
    assert planned_counts(4096, 2, 8, None) == (1024, 1024)
    assert planned_counts(4096, 2, 8, 1.25) == (1024, 1280)
    assert planned_counts(4096, 2, 8, 0.5) == (512, 512)  # dropping: at most the capacity


@pytest.mark.slow  # 5-7 s here: `make test` runs it, test-fast does not
def test_moe_plans_experts_per_ep_rank_at_256_ranks():
    """Mixtral-like (Llama-3-8B width, 8 experts, top-2) at tp=4 x dp 8x8 with ep=8: rank 0
    holds one expert per layer in full plus 1/32 of everything else; fp32 states."""
    model = {"preset": "llama3_8b", "n_layers": 2, "n_experts": 8, "top_k": 2}
    parallel = {"tp": 4, "dp_replicate": 8, "dp_shard": 8, "ep": 8}
    cfg = cpu_stand_in(
        TrainConfig(
            model={**model, "capacity_factor": 1.25},
            parallel=parallel,
            seq_len=4096,
            global_batch_size=256,
            micro_batch_size=1,
            precision="bf16",
            recompute="selective",
        )
    )
    info = plan_rank(cfg, 0, 256)
    expert = 3 * cfg.model.dim * cfg.model.ffn_hidden_dim  # 2 layers x 8 experts in the model
    local = (cfg.model.num_params() - 16 * expert) / 32 + 2 * expert
    assert info["local_params"] == pytest.approx(local, rel=1e-3)
    assert info["optimizer_gib"] == pytest.approx(2 * info["params_gib"], abs=2e-3)
    assert info["activations_gib"] > 0 and info["peak_gib"] > 4 * info["params_gib"]
