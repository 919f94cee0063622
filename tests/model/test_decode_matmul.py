"""The decode matmul op (kiln/model/decode_matmul.py). int8: fp32 activations times int8 weights
and a scale per output channel, equal to the fp32 product with the dequantized weight for every
shape (tails of K and N included); without bf16 units an int8 layer's decode-sized batches go
through it, and a quantized model decodes the same greedy tokens through it as through the exact
fp32 product it stands for. fp32: a column-major weight's product, the same for every shape;
`pack_for_cpu` routes an fp32 model's decode-sized batches through it with unchanged greedy
tokens."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from torch import nn

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model import cpu_linear, decode_matmul, native_ops, quantize
from kiln.model.cpu_linear import DecodeLinear, pack_for_cpu
from kiln.model.quantize import DEQUANTIZED_MIN_ROWS, Int8WeightOnlyLinear, quantize_model
from tests.engine.tiny import tiny_model

TOOLCHAIN = shutil.which(os.environ.get("CXX", "c++")) is not None


@pytest.fixture
def op():
    if not TOOLCHAIN or os.environ.get(decode_matmul.ENV, "").lower() == "torch":
        pytest.skip("no C++ compiler here: the op cannot be built (int8 layers use torch's kernel)")
    assert decode_matmul.available()


def _counted(monkeypatch, op: str) -> list:
    """A list that grows by one each time decode_matmul.<op> is called."""
    calls, real = [], getattr(decode_matmul, op)
    monkeypatch.setattr(decode_matmul, op, lambda *args: calls.append(1) or real(*args))
    return calls


def _codes(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8),
        torch.rand(n, generator=g) * 0.01 + 1e-4,
    )


@pytest.mark.parametrize("m", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("n,k", [(4, 8), (40, 64), (43, 61), (7, 3), (576, 1536)])
def test_the_op_is_the_fp32_product_with_the_dequantized_weight(op, m, n, k):
    qweight, scales = _codes(n, k, seed=m * 1000 + n + k)
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = decode_matmul.int8_mm(a, qweight, scales)
    want = decode_matmul.int8_mm_reference(a, qweight, scales)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    torch.testing.assert_close(got, want, atol=1e-5 * k**0.5, rtol=1e-5)


def test_the_op_splits_the_channels_over_threads_with_the_same_result(op):
    qweight, scales = _codes(1536, 576, seed=1)
    a = torch.randn(2, 576)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = decode_matmul.int8_mm(a, qweight, scales)
        torch.set_num_threads(2)
        two = decode_matmul.int8_mm(a, qweight, scales)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # each output is one thread's sum, in the same order


def _no_bf16_units(monkeypatch) -> None:
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)


@pytest.mark.parametrize("rows", [1, 2, 8, DEQUANTIZED_MIN_ROWS, 32])
def test_without_bf16_units_decode_batches_take_the_op_with_fp32_activations(op, monkeypatch, rows):
    """torch's int8 kernel rounds activations to bf16; the op keeps them fp32, so the layer is
    the exact fp32 product with its stored weight (up to summation order)."""
    _no_bf16_units(monkeypatch)
    torch.manual_seed(rows)
    linear = nn.Linear(64, 600, bias=True)
    layer = Int8WeightOnlyLinear(linear)
    assert layer.own_kernel
    calls = _counted(monkeypatch, "int8_mm")
    x = torch.randn(rows, 64)
    exact = nn.functional.linear(x, layer.dequantized(), linear.bias)
    torch.testing.assert_close(layer(x), exact, atol=1e-5, rtol=1e-5)
    assert calls == [1]


@pytest.mark.parametrize("rows", [1, 4, 5, 8])
def test_with_bf16_units_the_op_takes_the_rows_below_the_packed_copys(op, monkeypatch, rows):
    """Beside the packed bf16 copy (the CPU has bf16 units: here told so) the op takes 1-4 rows,
    fp32-exact; more go through the bf16 copy, whose bf16 activations tell the two apart."""
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: True, raising=False)
    torch.manual_seed(rows)
    linear = nn.Linear(64, 600, bias=True)
    layer = Int8WeightOnlyLinear(linear)
    assert layer.batched is not None
    calls = _counted(monkeypatch, "int8_mm")
    x = torch.randn(rows, 64)
    exact = nn.functional.linear(x, layer.dequantized(), linear.bias)
    y = layer(x)
    if rows in decode_matmul.INT8_ROWS_BESIDE_BF16:
        assert calls == [1]
        torch.testing.assert_close(y, exact, atol=1e-5, rtol=1e-5)
    else:
        assert calls == []
        assert (y - exact).abs().max() > 1e-4  # bf16 activations
        torch.testing.assert_close(y, exact, atol=5e-2, rtol=5e-2)


def test_switched_off_by_the_environment_int8_layers_keep_torchs_kernel(monkeypatch):
    monkeypatch.setenv(decode_matmul.ENV, "torch")
    _no_bf16_units(monkeypatch)
    assert not decode_matmul.available()
    assert not Int8WeightOnlyLinear(nn.Linear(16, 8)).own_kernel


def test_without_a_toolchain_the_op_is_unavailable_and_logged(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(native_ops, "_loaded", {})
    monkeypatch.setattr(native_ops, "BUILD_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler, no ninja
    with caplog.at_level(logging.WARNING, logger=native_ops.__name__):
        assert not decode_matmul.available()
    assert "decode matmul op unavailable" in caplog.text


def test_a_quantized_model_decodes_the_greedy_tokens_of_its_exact_fp32_product(op, monkeypatch):
    """The engine through the op (one row a step) against the same int8 model with every product
    taken as fp32 times the dequantized weight (the sliced path, forced from one row on)."""
    _no_bf16_units(monkeypatch)
    torch.manual_seed(0)
    model = quantize_model(tiny_model("llama", 320), "int8")
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9] * 11]
    params = SamplingParams(max_new_tokens=12)
    calls = _counted(monkeypatch, "int8_mm")
    through_op = Generator(model, tokenizer=None, eos_token_ids=[]).generate_ids(prompts, params)
    assert calls
    monkeypatch.setattr(decode_matmul, "INT8_ROWS", range(0))
    monkeypatch.setattr(quantize, "DEQUANTIZED_MIN_ROWS", 1)
    calls.clear()
    exact = Generator(model, tokenizer=None, eos_token_ids=[]).generate_ids(prompts, params)
    assert not calls
    assert through_op == exact


@pytest.mark.parametrize("m", [1, 2, 4, 5, 16, 17])
@pytest.mark.parametrize("k,n", [(8, 16), (64, 40), (61, 43), (3, 7), (576, 1536), (1536, 576)])
def test_the_fp32_op_is_the_product_with_the_column_major_weight(op, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    a, weight_kn = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    got = decode_matmul.fp32_mm(a, weight_kn)
    assert got.shape == (m, n)
    want = decode_matmul.fp32_mm_reference(a, weight_kn)
    torch.testing.assert_close(got, want, atol=1e-5 * k**0.5, rtol=1e-5)  # summation order


@pytest.mark.parametrize("rows", [1, 3, 4, 8, 16, 17, 40])
def test_an_fp32_layer_takes_the_op_for_decode_sized_batches_only(op, monkeypatch, rows):
    torch.manual_seed(rows)
    linear = nn.Linear(64, 600, bias=True)
    expected_weight = linear.weight.detach().clone()
    layer = DecodeLinear.of(linear).requires_grad_(False)
    assert layer.weight.stride(0) == 1 and torch.equal(layer.weight, expected_weight)
    calls = _counted(monkeypatch, "fp32_mm")
    x = torch.randn(rows, 64)
    torch.testing.assert_close(layer(x), nn.functional.linear(x, expected_weight, linear.bias))
    assert bool(calls) == (rows in decode_matmul.FP32_ROWS)


def test_an_fp32_model_decodes_the_same_greedy_tokens_with_the_op(op, monkeypatch):
    monkeypatch.setattr(cpu_linear, "fp32_linears_on_onednn", lambda: False)  # MKL's layout
    torch.manual_seed(0)
    model = tiny_model("llama", 320)
    assert pack_for_cpu(model)
    assert any(isinstance(m, DecodeLinear) for m in model.modules())
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9] * 11, [4, 4], [8, 1, 8]]  # 5 rows a decode step
    params = SamplingParams(max_new_tokens=12)
    calls = _counted(monkeypatch, "fp32_mm")
    through_op = Generator(model, tokenizer=None, eos_token_ids=[]).generate_ids(prompts, params)
    assert calls
    monkeypatch.setattr(decode_matmul, "FP32_ROWS", range(0))
    calls.clear()
    mkl = Generator(model, tokenizer=None, eos_token_ids=[]).generate_ids(prompts, params)
    assert not calls
    assert through_op == mkl
