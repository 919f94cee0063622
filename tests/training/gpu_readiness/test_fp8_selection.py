"""Which Linears fp8 converts (decided without torchao or Transformer Engine), which layouts
each fp8 backend refuses, its recipes, and `kiln plan` on an fp8 layout."""

from __future__ import annotations

import pytest
import torch

from kiln.model import Transformer
from kiln.model.config import ModelConfig
from kiln.platform.errors import ConfigError
from kiln.training.config import TrainConfig
from kiln.training.plan import cpu_stand_in, plan_rank
from kiln.training.precision import check_fp8_layout, fp8_linear_names


def _model(**shape) -> Transformer:
    shape = {
        "vocab_size": 256,
        "dim": 64,
        "n_layers": 2,
        "n_heads": 4,
        "ffn_hidden_dim": 128,
        **shape,
    }
    cfg = ModelConfig(**shape)
    with torch.device("meta"):
        return Transformer(cfg)


def test_moe_gate_and_experts_stay_out_of_fp8():
    names = fp8_linear_names(_model(n_experts=4, top_k=2))
    assert names, "attention projections are swapped"
    assert not [n for n in names if ".moe." in n]
    assert {n.rsplit(".", 1)[1] for n in names} == {"wq", "wk", "wv", "wo"}
    assert len(names) == 2 * 4


def test_dense_blocks_swap_attention_and_ffn_but_not_the_head():
    names = fp8_linear_names(_model())
    assert len(names) == 2 * 7 and "output" not in names
    assert "layers.0.feed_forward.w2" in names


def test_shapes_fp8_gemms_refuse_are_left_out():
    # ffn 72: not a multiple of 16, so w1/w2/w3 stay in bf16
    names = fp8_linear_names(_model(ffn_hidden_dim=72))
    assert not [n for n in names if "feed_forward" in n] and len(names) == 2 * 4


@pytest.mark.parametrize("dim", ["pp", "tp"])
def test_te_fp8_refuses_pipeline_and_tensor_parallel(dim):
    with pytest.raises(ConfigError, match=f"fp8_backend=te .*parallel.{dim} > 1"):
        check_fp8_layout(TrainConfig(precision="fp8", fp8_backend="te", parallel={dim: 2}))
    # data and context parallel are fine
    check_fp8_layout(
        TrainConfig(precision="fp8", fp8_backend="te", parallel={"dp_shard": 4, "cp": 2})
    )


@pytest.mark.parametrize("dim", ["pp", "tp", "dp_shard", "cp"])
def test_torchao_fp8_runs_on_every_layout(dim):
    check_fp8_layout(TrainConfig(precision="fp8", parallel={dim: 2}))


def test_fp8_wants_a_rank_sequence_of_multiples_of_16():
    check_fp8_layout(TrainConfig(precision="fp8", seq_len=64, parallel={"cp": 4}))
    with pytest.raises(ConfigError, match=r"seq_len / parallel.cp \(8\) to be a multiple of 16"):
        check_fp8_layout(TrainConfig(precision="fp8", seq_len=64, parallel={"cp": 8}))


def test_fp8_recipe_belongs_to_its_backend():
    assert TrainConfig(precision="fp8").fp8_scaling == "tensorwise"
    assert TrainConfig(precision="fp8", fp8_backend="te").fp8_scaling == "delayed"
    assert TrainConfig(precision="fp8", fp8_recipe="rowwise").fp8_scaling == "rowwise"
    with pytest.raises(
        ConfigError, match="fp8_recipe=delayed is not a recipe of fp8_backend=torchao"
    ):
        TrainConfig(precision="fp8", fp8_recipe="delayed")
    with pytest.raises(ConfigError, match="fp8_recipe=rowwise .* fp8_backend=te"):
        TrainConfig(precision="fp8", fp8_backend="te", fp8_recipe="rowwise")


def test_fp8_all_gather_needs_one_scale_per_weight():
    assert TrainConfig(precision="fp8", fp8_all_gather=True).fp8_all_gather
    for other in ({"fp8_recipe": "rowwise"}, {"fp8_backend": "te"}):
        with pytest.raises(ConfigError, match="fp8_all_gather needs fp8_backend: torchao"):
            TrainConfig(precision="fp8", fp8_all_gather=True, **other)


def test_planning_an_fp8_pipeline_fails_like_a_real_run():
    cfg = TrainConfig(precision="fp8", fp8_backend="te", parallel={"pp": 2, "dp_shard": 1})
    with pytest.raises(ConfigError, match="parallel.pp"):
        cpu_stand_in(cfg)


def test_planning_torchao_fp8_under_tp_and_fsdp_on_fake_ranks():
    """`kiln plan`'s stand-in keeps the layout; fp8 saves bf16 inputs for backward, so the plan
    builds it in bf16 (the same activation and parameter memory)."""
    for parallel in ({"tp": 2}, {"dp_shard": 2}):
        cfg = TrainConfig(
            model={"preset": "tiny", "n_layers": 2},
            precision="fp8",
            parallel=parallel,
            seq_len=32,
            global_batch_size=2,
            micro_batch_size=1,
        )
        stand_in = cpu_stand_in(cfg)
        assert stand_in.precision == "bf16" and stand_in.parallel == cfg.parallel
        info = plan_rank(stand_in, 0, 2)
        assert info["local_params"] < ModelConfig.preset("tiny", n_layers=2).num_params()


def test_torchao_fp8_needs_torchao_and_an_fp8_gpu(monkeypatch):
    import importlib.util

    from kiln.platform.extras import MissingExtraError
    from kiln.training.float8 import check_float8_available

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "torchao" else find_spec(n)
    )
    with pytest.raises(ConfigError, match=r"compute capability >= 8.9, this GPU has \(8, 0\)"):
        check_float8_available(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_float8_available(torch.device("cuda", 0))  # Hopper
    check_float8_available(torch.device("cpu"))  # torch's CPU _scaled_mm (tests)
    with pytest.raises(ConfigError, match="not mps"):
        check_float8_available(torch.device("mps"))
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "torchao" else find_spec(n)
    )
    with pytest.raises(MissingExtraError, match=r"kiln\[gpu\].*not installed: torchao"):
        check_float8_available(torch.device("cpu"))
