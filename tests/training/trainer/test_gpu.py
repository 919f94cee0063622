"""CUDA-only checks (skipped without a GPU): attention backends, bf16 and fp8 training, one GPU."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kiln.model import AttentionCore
from tests.training.trainer.layouts import train_losses

pytestmark = pytest.mark.gpu

needs_flash = pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="flash-attn not installed"
)
needs_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="TE not installed"
)


def _qkv(hq=8, hkv=2, seq=256, dh=64):
    torch.manual_seed(0)

    def make(h):
        return torch.randn(2, h, seq, dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    return make(hq), make(hkv), make(hkv)


def _check_against_sdpa(backend: str, window: int | None):
    q, k, v = _qkv()
    out = AttentionCore(64, window, backend)(q, k, v)
    ref = AttentionCore(64, window, "sdpa")(q, k, v)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    g = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    for a, b in zip(g, g_ref, strict=False):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


@needs_flash
@pytest.mark.parametrize("window", [None, 64])
def test_flash_attn_backend_matches_sdpa(window):
    _check_against_sdpa("flash_attn", window)


@needs_te
@pytest.mark.parametrize("window", [None, 64])
def test_te_attention_backend_matches_sdpa(window):
    _check_against_sdpa("te", window)


def test_bf16_trains_on_gpu():
    losses = train_losses(
        device="cuda", precision="bf16", optimizer={"lr": 1e-2}, steps=8, repeat_batch=True
    )
    assert losses[-1] < losses[0] - 0.1


# fp8 GEMMs want dims that are multiples of 16.
FP8_MODEL = {"preset": "tiny", "dim": 128, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden_dim": 256}
FP8_RECIPES = [
    ("te", "delayed"),
    ("te", "current"),
    ("torchao", "tensorwise"),
    ("torchao", "rowwise"),
]


@pytest.mark.parametrize(("backend", "recipe"), FP8_RECIPES)
def test_fp8_trains_on_gpu(backend, recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    if backend == "te" and importlib.util.find_spec("transformer_engine") is None:
        pytest.skip("TE not installed")  # torchao is a carried wheel: its absence fails
    losses = train_losses(
        device="cuda",
        precision="fp8",
        fp8_backend=backend,
        fp8_recipe=recipe,
        model=FP8_MODEL,
        micro_batch_size=16,
        global_batch_size=16,
        seq_len=32,
        optimizer={"lr": 1e-2},
        steps=8,
        repeat_batch=True,
    )
    assert losses[-1] < losses[0] - 0.1, recipe
