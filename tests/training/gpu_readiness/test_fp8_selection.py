"""Which Linears fp8 swaps for te.Linear (decided without Transformer Engine) and which layouts
fp8 refuses."""

from __future__ import annotations

import pytest
import torch

from kiln.model import Transformer
from kiln.model.config import ModelConfig
from kiln.platform.errors import ConfigError
from kiln.training.config import ParallelConfig, TrainConfig
from kiln.training.plan import cpu_stand_in
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
def test_fp8_refuses_pipeline_and_tensor_parallel(dim):
    with pytest.raises(ConfigError, match=f"parallel.{dim} > 1"):
        check_fp8_layout(ParallelConfig(**{dim: 2}))
    check_fp8_layout(ParallelConfig(dp_shard=4, cp=2))  # data and context parallel are fine


def test_planning_an_fp8_pipeline_fails_like_a_real_run():
    cfg = TrainConfig(precision="fp8", parallel={"pp": 2, "dp_shard": 1})
    with pytest.raises(ConfigError, match="parallel.pp"):
        cpu_stand_in(cfg)
