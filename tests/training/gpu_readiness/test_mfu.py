"""MFU accounting: the FLOPs a step really does (tied head, causal and windowed attention), the
datasheet peak of each GPU model, and the GPU defaults (bf16, TF32)."""

from __future__ import annotations

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.training.config import TrainConfig
from kiln.training.launch import enable_tf32, resolve_auto_precision
from kiln.training.metrics import attended_keys, flops_per_token, peak_tflops_for


@pytest.mark.parametrize(("seq", "window"), [(16, None), (16, 4), (2048, 512), (7, 7), (5, 9)])
def test_attended_keys_counts_the_mask(seq, window):
    """Against the mask itself: causal, and each query sees at most `window` keys."""
    i = torch.arange(seq)
    visible = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < (window or seq))
    assert attended_keys(seq, window) == pytest.approx(visible.sum().item() / seq)


def test_tied_head_is_still_a_matmul():
    untied = ModelConfig.preset("tiny")
    tied = untied.model_copy(update={"tie_embeddings": True})
    assert flops_per_token(tied, 128) == flops_per_token(untied, 128)


def test_llama3_8b_flops_per_token():
    cfg = ModelConfig.preset("llama3_8b")
    n = cfg.num_params(exclude_embedding=True)
    attention = 12 * 32 * 32 * 128 * (8192 + 1) / 2
    assert flops_per_token(cfg, 8192) == pytest.approx(6 * n + attention)
    windowed = cfg.model_copy(update={"sliding_window": 1024})
    assert flops_per_token(windowed, 8192) < flops_per_token(cfg, 8192)


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 NVL", "fp8", 1670.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 156.0),  # TF32 on
        ("NVIDIA B200", "bf16", 2250.0),
        ("Some CPU", "bf16", None),
    ],
)
def test_datasheet_peaks(name, precision, tflops):
    assert peak_tflops_for(name, precision) == tflops


def test_fp32_peak_without_tf32_is_the_plain_fp32_one():
    assert peak_tflops_for("NVIDIA H200", "fp32", tf32=False) == 66.9


def test_precision_auto_is_bf16_on_gpus_fp32_on_cpu():
    cfg = TrainConfig()
    assert cfg.precision == "auto"
    assert resolve_auto_precision(cfg, cuda_available=True).precision == "bf16"
    assert resolve_auto_precision(cfg, cuda_available=False).precision == "fp32"
    on_cpu = cfg.model_copy(update={"device": "cpu"})
    assert resolve_auto_precision(on_cpu, cuda_available=True).precision == "fp32"
    fp16 = cfg.model_copy(update={"precision": "fp16"})
    assert resolve_auto_precision(fp16, cuda_available=True).precision == "fp16"


def test_enable_tf32_sets_the_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        enable_tf32()
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
