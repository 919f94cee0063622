"""The GPU gate's rules fail when the figures of a broken GPU path are fed to them: a NaN loss, a
model that does not learn, a math-kernel fallback, a below-floor MFU, a torch without an API."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from kiln.model.config import ModelConfig
from kiln.model.transformer import BASE_STD, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import gpu_check  # noqa: E402
import gpu_check_train  # noqa: E402
from gpu_gate import (  # noqa: E402
    INITIAL_LOSS_TOLERANCE_NATS,
    MFU_FLOORS,
    GateFailure,
    check_apis,
    check_finite,
    check_initial_loss,
    check_learns,
    check_mfu,
    check_parity,
    expected_initial_loss,
)


def _small(cfg):
    """The dry stage's config at one layer, 2 steps of 16 tokens: the rules' failures, quickly."""
    model = cfg.model.model_copy(update={"n_layers": 1})
    return cfg.model_copy(update={"model": model, "steps": 2, "seq_len": 16})


def test_a_nan_loss_or_grad_norm_fails():
    check_finite({"loss": 5.5, "grad_norm": 0.8})
    with pytest.raises(GateFailure, match="loss is nan"):
        check_finite({"step": 3, "loss": float("nan"), "grad_norm": 0.8})
    with pytest.raises(GateFailure, match="grad_norm is inf"):
        check_finite({"loss": 5.5, "grad_norm": float("inf")})


def test_torchrun_figures_fail_on_a_nan_step(tmp_path):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": float("nan"), "grad_norm": 1.0}) + "\n")
    assert gpu_check.main(["torchrun-figures", str(metrics)]) == 1


def test_step_zero_loss_must_be_ln_vocab_plus_the_head_variance():
    # The H200 run's step-0 losses: 1b (dim 2048) 12.18, 8B slice (dim 4096) 12.60.
    check_initial_loss(12.18, 128256, 2048, 0.02)
    check_initial_loss(12.60, 128256, 4096, 0.02)
    with pytest.raises(GateFailure, match="ln\\(vocab=128256\\)"):
        check_initial_loss(12.18 / 8, 128256, 2048, 0.02)  # e.g. divided by the accumulation
    with pytest.raises(GateFailure, match="ln\\(vocab=128256\\)"):
        check_initial_loss(math.log(128256), 128256, 4096, 0.02)  # the old rule's figure


def test_a_fresh_model_starts_at_the_expected_loss():
    """The rule's formula against a real freshly initialised model on uniform tokens: at dim
    2048 the head's variance adds 0.41 nats to ln V, more than the tolerance."""
    cfg = ModelConfig(vocab_size=4096, dim=2048, n_layers=1, n_heads=16, max_seq_len=128)
    torch.manual_seed(0)
    model = Transformer(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (32, 129))  # 4,096 targets: noise ~0.014 nats
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).item()
    expected = expected_initial_loss(cfg.vocab_size, cfg.dim, BASE_STD)
    assert expected - math.log(cfg.vocab_size) > INITIAL_LOSS_TOLERANCE_NATS
    assert abs(loss - expected) < 0.05, (loss, expected)
    check_initial_loss(loss, cfg.vocab_size, cfg.dim, BASE_STD)


def test_parity_fails_on_a_doubled_gradient():
    single = {"loss": 11.76, "grad_norm": 2.0}
    check_parity("shard", single, {"loss": 11.76 * (1 + 1e-5), "grad_norm": 2.0})
    with pytest.raises(GateFailure, match="shard: first-step grad_norm"):
        check_parity("shard", single, {"loss": 11.76, "grad_norm": 4.0})


def test_a_below_floor_mfu_fails_and_each_measured_row_has_a_floor():
    check_mfu("1b_bf16", MFU_FLOORS["1b_bf16"])
    with pytest.raises(GateFailure, match="1b_bf16_eager: MFU 0.21 is below its floor 0.3"):
        check_mfu("1b_bf16_eager", 0.21)
    with pytest.raises(GateFailure, match="below its floor"):
        check_mfu("8b_slice_bf16", None)  # no peak known: no MFU is no pass
    unmeasurable = set(gpu_check_train.NEEDS_PACKAGE)
    rows = {row for row, _ in gpu_check_train.planned_runs()} - unmeasurable
    assert rows == set(MFU_FLOORS)


def test_a_model_that_does_not_learn_fails():
    check_learns([11.7, 9.0, 8.5])
    with pytest.raises(GateFailure, match="not learnt"):
        check_learns([11.7, 11.6, 11.5])
    with pytest.raises(GateFailure, match="not learnt"):
        gpu_check_train.learn(_small(gpu_check_train.learn_config(dry=True, lr=1e-12)))


def test_a_math_kernel_fallback_is_an_error():
    """Only a kernel this device lacks is allowed (cuDNN on CPU): SDPA must refuse the step,
    which is what a GPU config that falls to the math kernel meets under the CUDA list."""
    cfg = _small(gpu_check_train.learn_config(dry=True))
    trainer = gpu_check_train.Trainer(cfg, dataloader=gpu_check_train.repeated_batch(cfg)).setup()
    only_cudnn = gpu_check_train.fused_attention_only("cpu", [SDPBackend.CUDNN_ATTENTION])
    with pytest.raises(GateFailure, match="math fallback"), only_cudnn:
        trainer.train_step()
    with gpu_check_train.fused_attention_only("cpu"):  # the CPU's fused kernel is allowed
        assert math.isfinite(trainer.train_step()["loss"])


def test_imports_stage_fails_on_a_missing_torch_api(monkeypatch, capsys):
    check_apis({"fully_shard": True})
    monkeypatch.setitem(sys.modules, "ray", None)  # as on the GPU image
    monkeypatch.delattr(torch.nn.utils, "get_total_norm")
    assert gpu_check.main(["imports"]) == 1
    assert "torch lacks: get_total_norm" in capsys.readouterr().err
