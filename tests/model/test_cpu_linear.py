"""CPU linear layers laid out for their kernels (kiln.model.cpu_linear): a packed bf16 layer
computes the bf16 product a plain layer does, a packed model's logits and state dict are the
plain bf16 model's, a weight refit repacks, and without the CPU flags (monkeypatched away)
nothing is packed but more than two rows multiply in fp32; an fp32 model (column-major block
linears and a packed head, or everything packed for oneDNN) keeps its logits, state dict and
greedy tokens, and follows a refit."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.engine import generator as generator_module
from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model import ModelConfig, Transformer, cpu_linear
from kiln.model.cpu_linear import (
    PackedBf16Linear,
    PackedLinear,
    UpcastBf16Linear,
    cpu_has_bf16_matmul,
    cpu_has_fp32_packing,
    pack_for_cpu,
)
from kiln.model.cpu_swiglu import PackedSwiGLU
from kiln.model.quantize import Int8WeightOnlyLinear, quantize_model

needs_bf16_units = pytest.mark.skipif(
    not cpu_has_bf16_matmul(), reason="this CPU has no AMX / AVX-512-BF16 (the fallback runs)"
)
# A packed product is the exact bf16 x bf16 product summed in fp32, then rounded to bf16 (one
# rounding: a relative error of at most 2^-8 of each output, plus the summation order)
BF16_OUTPUT_RTOL = 2**-8


def _tiny_bf16_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=160, **overrides
    )
    return Transformer(cfg).to(torch.bfloat16).eval().requires_grad_(False)


@needs_bf16_units
@pytest.mark.parametrize("rows", [1, 3, 8, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_is_the_bf16_product(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    packed = PackedBf16Linear(linear)
    x = torch.randn(2, rows, 96)
    w, xb = linear.weight.bfloat16().float(), x.bfloat16().float()
    b = None if linear.bias is None else linear.bias.bfloat16().float()
    reference = F.linear(xb, w, b)  # exact bf16 inputs, fp32 sums
    y = packed(x)
    assert y.dtype == x.dtype and y.shape == (2, rows, 200)
    scale = reference.abs().amax().item()
    torch.testing.assert_close(y, reference, rtol=BF16_OUTPUT_RTOL, atol=BF16_OUTPUT_RTOL * scale)
    # the packed weight unpacks to the bf16 weight, bit for bit
    assert torch.equal(packed.weight, linear.weight.bfloat16())


@needs_bf16_units
@pytest.mark.parametrize("tied", [False, True])
def test_packed_model_keeps_the_bf16_models_logits_state_and_refits(tied):
    plain = _tiny_bf16_model(tie_embeddings=tied)
    packed = copy.deepcopy(plain)
    assert pack_for_cpu(packed)
    linears = [m for m in packed.modules() if type(m) is nn.Linear]
    assert not linears and isinstance(packed.output, PackedBf16Linear)
    tokens = torch.randint(0, 96, (3, 20))
    ref, got = plain(tokens).float(), packed(tokens).float()
    # bf16 activations through two layers: the same model, a different summation order
    torch.testing.assert_close(got, ref, rtol=0.02, atol=0.02 * ref.abs().amax().item())
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    plain_state, packed_state = plain.state_dict(), packed.state_dict()
    assert plain_state.keys() == packed_state.keys()
    for name, value in plain_state.items():
        assert torch.equal(packed_state[name], value), name
    # a weight refit (the RL engine's load_state_dict) repacks: the packed model follows it
    other = _tiny_bf16_model(seed=1, tie_embeddings=tied)
    packed.load_state_dict(other.state_dict())
    ref = other(tokens).float()
    torch.testing.assert_close(
        packed(tokens).float(), ref, rtol=0.02, atol=0.02 * ref.abs().amax().item()
    )


@needs_bf16_units
def test_generator_load_bf16_packs_and_decodes_as_the_plain_bf16_model(tmp_path):
    from tests.serving.rest.tiny_model import make_tiny_model

    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    packed = Generator.load(model_dir, dtype=torch.bfloat16)
    assert isinstance(packed.model.output, PackedBf16Linear)
    plain = Generator.load(model_dir, dtype=torch.bfloat16)
    for parent in plain.model.modules():  # undo the packing: today's plain bf16 path
        for name, child in parent.named_children():
            if isinstance(child, PackedBf16Linear):
                linear = nn.Linear(child.in_features, child.out_features, bias=False)
                linear.weight = nn.Parameter(child.weight, requires_grad=False)
                setattr(parent, name, linear)
    prompts = [[5, 9, 13, 2], [7, 7, 1]]
    greedy = SamplingParams(max_new_tokens=8)
    a, b = packed.generate_ids(prompts, greedy), plain.generate_ids(prompts, greedy)
    pairs = zip(sum(a, []), sum(b, []), strict=True)
    agree = sum(x == y for x, y in pairs)
    assert agree >= 0.8 * sum(map(len, a)), (a, b)


def _no_bf16_units(monkeypatch) -> None:
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    assert not cpu_has_bf16_matmul()


def test_no_bf16_units_no_packing_but_many_rows_in_fp32(monkeypatch):
    _no_bf16_units(monkeypatch)
    model = _tiny_bf16_model()
    plain = copy.deepcopy(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert pack_for_cpu(model)
    assert type(model.output) is UpcastBf16Linear  # bf16 weights kept, no packed copy
    assert model.output.weight.dtype == torch.bfloat16
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    tokens = torch.randint(0, 96, (1, 2))  # two rows per linear: the plain bf16 kernel
    assert torch.equal(model(tokens), plain(tokens))
    tokens = torch.randint(0, 96, (2, 24))  # 48 rows: fp32 products, rounded once to bf16
    got, ref = model(tokens).float(), plain(tokens).float()
    assert (got - ref).abs().max() <= 0.1 * ref.abs().max()  # bf16 vs fp32 sums, 2 layers


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_upcast_bf16_linear_is_the_fp32_product_rounded_once(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(64, 600, bias=bias).to(torch.bfloat16)  # 600: three slices, one partial
    layer = UpcastBf16Linear.of(linear)
    assert layer.weight is linear.weight  # the same parameters: a refit reaches them
    x = torch.randn(rows, 64).to(torch.bfloat16)
    bias_fp32 = None if linear.bias is None else linear.bias.float()
    expected = F.linear(x.float(), linear.weight.float(), bias_fp32).to(torch.bfloat16)
    torch.testing.assert_close(layer(x), expected, atol=0, rtol=2**-7)


def test_only_the_amx_flag_is_enough(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert cpu_has_bf16_matmul()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not cpu_has_bf16_matmul()  # no oneDNN, no packed kernels


def test_quantized_models_are_not_packed():
    int8 = quantize_model(_tiny_bf16_model().float(), "int8")
    pack_for_cpu(int8)
    assert isinstance(int8.output, Int8WeightOnlyLinear)


needs_fp32_packing = pytest.mark.skipif(
    not cpu_has_fp32_packing(), reason="this torch has no oneDNN or no MKL"
)


@needs_fp32_packing
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_packed_fp32_linear_is_the_fp32_product(rows):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=True)
    packed = PackedLinear(linear, torch.float32)
    x = torch.randn(2, rows, 96)
    reference = F.linear(x.double(), linear.weight.double(), linear.bias.double())
    y = packed(x)
    assert y.dtype == torch.float32 and y.shape == (2, rows, 200)
    torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(packed.weight, linear.weight)  # unpacks bit for bit


@needs_fp32_packing
@pytest.mark.parametrize("onednn", [False, True], ids=["mkl", "onednn"])
@pytest.mark.parametrize("tied", [False, True])
def test_fp32_layout_keeps_the_models_logits_state_and_refits(tied, onednn, monkeypatch):
    monkeypatch.setattr(cpu_linear, "fp32_linears_on_onednn", lambda: onednn)
    plain = _tiny_bf16_model(tie_embeddings=tied).float()
    laid_out = copy.deepcopy(plain)
    assert pack_for_cpu(laid_out)
    assert isinstance(laid_out.output, PackedLinear) and laid_out.output.dtype == torch.float32
    block_linears = [m for m in laid_out.modules() if isinstance(m, nn.Linear)]
    packed = [m for m in laid_out.modules() if isinstance(m, PackedLinear)]
    if onednn:  # every linear packed, the gated FFNs fused
        assert not block_linears and len(packed) == 1 + 7 * len(laid_out.layers)
        assert sum(isinstance(m, PackedSwiGLU) for m in laid_out.modules()) == len(laid_out.layers)
    else:
        assert block_linears and all(m.weight.stride(0) == 1 for m in block_linears)  # col-major
    assert laid_out.tok_embeddings.weight.is_contiguous()  # the embedding's rows stay rows
    tokens = torch.randint(0, 96, (3, 20))
    ref, got = plain(tokens), laid_out(tokens)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)  # fp32: only summation order
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    plain_state, laid_out_state = plain.state_dict(), laid_out.state_dict()
    assert list(plain_state) == list(laid_out_state)
    for name, value in plain_state.items():
        assert torch.equal(laid_out_state[name], value), name
    # a copy repacks; a refit through load_state_dict reaches packed and column-major weights
    other = _tiny_bf16_model(seed=1, tie_embeddings=tied).float()
    laid_out = copy.deepcopy(laid_out)
    laid_out.load_state_dict(other.state_dict())
    torch.testing.assert_close(laid_out(tokens), other(tokens), rtol=1e-5, atol=1e-5)
    assert all(m.weight.stride(0) == 1 for m in laid_out.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize(
    "env,isa,vendor,expected",
    [
        ("", "AVX512", "AuthenticAMD", True),  # Zen 4: oneDNN's kernels beat MKL's
        ("", "AVX2", "AuthenticAMD", False),  # Zen 3: MKL and Kiln's op
        ("", "AVX512", "GenuineIntel", False),  # MKL's home ground
        ("mkl", "AVX512", "AuthenticAMD", False),
        ("onednn", "AVX2", "GenuineIntel", True),
    ],
)
def test_fp32_linears_go_to_onednn_on_avx512_amd_cpus_or_when_told(
    monkeypatch, env, isa, vendor, expected
):
    monkeypatch.setenv(cpu_linear.FP32_LAYOUT_ENV, env)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
    monkeypatch.setattr(cpu_linear, "_cpu_vendor", lambda: vendor)
    cpu_linear.fp32_linears_on_onednn.cache_clear()
    try:
        assert cpu_linear.fp32_linears_on_onednn() is expected
    finally:
        cpu_linear.fp32_linears_on_onednn.cache_clear()


@needs_fp32_packing
def test_generator_load_fp32_lays_out_and_decodes_as_the_plain_model(tmp_path, monkeypatch):
    from tests.serving.rest.tiny_model import make_tiny_model

    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    laid_out = Generator.load(model_dir)
    assert isinstance(laid_out.model.output, PackedLinear)
    monkeypatch.setattr(generator_module, "pack_for_cpu", lambda model, **options: False)
    plain = Generator.load(model_dir)  # today's plain fp32 path
    assert type(plain.model.output) is nn.Linear
    prompts = [[5, 9, 13, 2], [7, 7, 1], [3, 1, 4, 1, 5, 9, 2, 6]]
    greedy = SamplingParams(max_new_tokens=12)
    assert laid_out.generate_ids(prompts, greedy) == plain.generate_ids(prompts, greedy)
