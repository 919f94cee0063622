"""`kiln plan`'s per-rank memory: against a real run measured on CPU, and the figures it gives
for Llama-3 8B and 70B widths at several layouts on fake ranks."""

from __future__ import annotations

import pytest

from kiln.training.config import TrainConfig
from kiln.training.plan import cpu_stand_in, plan_rank, plan_step
from tests.training.distributed import run_distributed
from tests.training.gpu_readiness._plan_cases import measured_peak_bytes, small_config

GIB = 2**30


def _planned_peak(cfg: TrainConfig, world: int) -> int:
    return plan_step(cfg, 0, world)[1].peak  # bytes: these runs are ~0.01 GiB


@pytest.mark.slow  # a real run in a fresh process: ~10 s on the loaded 2-core machine
@pytest.mark.parametrize("recompute", ["selective", "none", "full"])
def test_planned_peak_matches_a_measured_cpu_run(recompute):
    cfg = small_config(recompute)
    [measured] = run_distributed(measured_peak_bytes, 1, cfg)
    planned = _planned_peak(cfg, 1)
    assert abs(planned - measured) / measured < 0.10, (planned, measured)


@pytest.mark.slow
def test_planned_peak_matches_a_measured_fsdp_rank():
    cfg = small_config("selective", {"dp_shard": 2})
    measured = run_distributed(measured_peak_bytes, 2, cfg)[0]
    planned = _planned_peak(cfg, 2)
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


def test_moe_models_are_refused_in_one_line():
    from kiln.platform.errors import ConfigError

    cfg = TrainConfig(model={"preset": "tiny", "n_experts": 4, "top_k": 2}, device="cpu")
    with pytest.raises(ConfigError, match="n_experts"):
        plan_rank(cfg, 0, 1)
