"""Every shipped pipeline YAML validates, and its train stage builds its model and layout as the
first and last rank of the real world size, on PyTorch's fake process-group backend, and steps
once on fake tensors (shrunk matrices: the layout, not the size, is under test here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.platform.errors import ConfigError
from kiln.training.plan import cpu_stand_in, plan_rank, train_configs, world_size_of

PIPELINES = Path(__file__).resolve().parents[3] / "kiln" / "pipelines"
SHIPPED = sorted(PIPELINES.rglob("*.yaml"))


def test_there_are_shipped_yamls():
    assert {p.name for p in SHIPPED} >= {"pretrain_gpt.yaml", "quickstart.yaml"}


# pretrain_gpt.yaml, the largest, takes ~9 s to build here: `make test` runs it, test-fast does not
CASES = [
    pytest.param(p, marks=pytest.mark.slow) if p.name == "pretrain_gpt.yaml" else p for p in SHIPPED
]


@pytest.mark.parametrize("spec", CASES, ids=lambda p: p.name)
def test_shipped_yaml_builds_on_fake_ranks(spec):
    for name, cfg in train_configs(str(spec)):
        world = world_size_of(cfg)
        stand_in = cpu_stand_in(cfg, shrink=True)
        for rank in (0, world - 1):  # first and last pipeline stage
            info = plan_rank(stand_in, rank, world)
            assert info["grad_accum"] >= 1 and info["local_params"] > 0, (name, info)
            assert info["activations_gib"] > 0 and info["peak_gib"] > 0, (name, info)


def test_pretrain_gpt_is_a_32_rank_layout():
    [(_, cfg)] = train_configs(str(PIPELINES / "pretrain_gpt.yaml"))
    assert world_size_of(cfg) == 32
    assert cfg.global_batch_size * cfg.seq_len == 4 * 2**20  # 4M tokens per step


def test_pipeline_micro_batch_mismatch_fails_like_a_real_run():
    [(_, cfg)] = train_configs(str(PIPELINES / "pretrain_gpt.yaml"))
    bad = cpu_stand_in(cfg.model_copy(update={"micro_batch_size": 1}), shrink=True)
    with pytest.raises(ConfigError, match="pp_microbatches"):
        plan_rank(bad, 0, world_size_of(cfg))


def test_kiln_plan_cli_gives_the_one_line_error(capsys):
    from kiln.platform.cli import main

    code = main(["plan", str(PIPELINES / "pretrain_gpt.yaml"), "--world", "24"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("kiln: error: parallel:") and "world size is 24" in err[-1]
