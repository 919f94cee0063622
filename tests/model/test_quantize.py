"""Weight-only int8 / int4 quantization (kiln.model.quantize): the packed kernels multiply by the
weights they claim, a briefly trained model keeps its perplexity on held-out text within a
stated bound, greedy decoding through the engine mostly agrees with fp32, and misuse is a
ConfigError that names the field."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.evaluate.perplexity import perplexity
from kiln.model import ModelConfig, Transformer, decode_matmul
from kiln.model.cpu_linear import cpu_has_bf16_matmul
from kiln.model.quantize import (
    DEQUANTIZED_MIN_ROWS,
    WEIGHT_ONLY_MAX_ROWS,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    quantize_model,
)
from kiln.platform.errors import ConfigError
from tests.engine.tiny import tiny_model

# Stated bounds: held-out perplexity of the quantized model over fp32's (measured 1.0005 for
# int8 and 1.005 for int4 group 32 on this model; SmolLM2's are in docs/benchmarks.md)
INT8_PPL_RATIO = 1.01
INT4_PPL_RATIO = 1.03

SUBJECTS = ["the fox", "a dog", "my cat", "the bird", "our horse", "the old man", "a child"]
VERBS = ["jumps over", "runs past", "looks at", "sleeps near", "sings to", "waits for"]
OBJECTS = ["the fence", "a tree", "the river", "the house", "a red ball", "the lazy dog"]
SEQ = 48


def _text(seed: int, sentences: int) -> torch.Tensor:
    """Bytes of a small made-up language (train and held-out text differ by seed)."""
    rng = random.Random(seed)
    words = (
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."
        for _ in range(sentences)
    )
    return torch.tensor(list(" ".join(words).encode()))


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small matrices: one thread is fastest, and spare cores stay with the other tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained(one_torch_thread) -> Transformer:
    """A byte-level model trained for a few seconds: real structure for the noise to disturb."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=128
    )
    model = Transformer(cfg)
    data = _text(0, 2000)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        starts = torch.randint(0, len(data) - SEQ - 1, (8,))
        batch = torch.stack([data[s : s + SEQ + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def held_out() -> torch.Tensor:
    text = _text(1, 150)
    n = len(text) // (SEQ + 1)
    return text[: n * (SEQ + 1)].view(n, SEQ + 1)


def _greedy(model: nn.Module, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    gen = Generator(model, tokenizer=None, eos_token_ids=[])
    return gen.generate_ids(prompts, SamplingParams(max_new_tokens=tokens))


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of greedy tokens produced before the first one that differs, over all rows."""
    same = 0
    for x, y in zip(a, b, strict=True):
        same += next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
    return same / sum(len(x) for x in a)


@pytest.mark.parametrize(
    ("method", "group_size", "bound"), [("int8", 32, INT8_PPL_RATIO), ("int4", 32, INT4_PPL_RATIO)]
)
def test_quantized_perplexity_within_bound_of_fp32(trained, held_out, method, group_size, bound):
    quantized = quantize_model(copy.deepcopy(trained), method, group_size=group_size)
    fp32 = math.exp(perplexity(trained, held_out).nll)
    ppl = math.exp(perplexity(quantized, held_out).nll)
    prompts = [row[:16].tolist() for row in held_out[:8]]
    agree = _agreement(_greedy(trained, prompts, 24), _greedy(quantized, prompts, 24))
    print(
        f"{method}: perplexity {ppl:.4f} vs fp32 {fp32:.4f} ({ppl / fp32:.4f}x), "
        f"greedy agreement {agree:.3f}"
    )
    assert fp32 < 12  # the model learned the language (uniform over bytes would be 256)
    assert ppl / fp32 <= bound
    assert agree >= 0.5


def _bf16_input_reference(x: torch.Tensor, layer: nn.Module, bias) -> torch.Tensor:
    """What the kernel should compute: bf16-rounded activations times the stored weight."""
    x = x.to(torch.bfloat16).float()
    return F.linear(x, layer.dequantized(), bias)


@pytest.mark.parametrize("out_features", [48, 24])  # 24: int4 pads N to a multiple of 16
def test_packed_kernels_multiply_by_the_quantized_weight(out_features):
    torch.manual_seed(0)
    linear = nn.Linear(64, out_features, bias=True)
    x = torch.randn(3, 5, 64)
    exact = linear(x)
    for layer, tolerance in (
        (Int8WeightOnlyLinear(linear), 0.02),
        (Int4WeightOnlyLinear(linear, 32), 0.2),
    ):
        y = layer(x)
        assert y.shape == exact.shape and y.dtype == torch.float32
        expected = _bf16_input_reference(x, layer, linear.bias)
        assert torch.allclose(y, expected, atol=2e-2, rtol=2e-2)
        # and the stored weight is the original one up to the format's rounding
        w_err = (layer.dequantized() - linear.weight).abs().max() / linear.weight.abs().max()
        assert 0 < w_err < tolerance


class _CountingWeight:
    """Wraps a layer's packed bf16 copy, counting the rows it multiplies."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, 0

    def matmul(self, a: torch.Tensor) -> torch.Tensor:
        self.rows += a.shape[0]
        return self.inner.matmul(a)


@pytest.mark.skipif(not cpu_has_bf16_matmul(), reason="no AMX / AVX-512-BF16: no packed copy")
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 40])
def test_many_rows_go_through_the_packed_bf16_copy_of_the_same_weight(rows):
    torch.manual_seed(rows)
    linear = nn.Linear(64, 40, bias=True)
    x = torch.randn(rows, 64)
    for layer in (Int8WeightOnlyLinear(linear), Int4WeightOnlyLinear(linear, 32)):
        layer.batched = _CountingWeight(layer.batched)
        y = layer(x)
        # the weight-only kernel up to WEIGHT_ONLY_MAX_ROWS rows (int8: Kiln's op, where it
        # builds, up to its last row beside the copy), the packed copy beyond
        few = WEIGHT_ONLY_MAX_ROWS
        if isinstance(layer, Int8WeightOnlyLinear) and layer.own_kernel:
            few = max(few, decode_matmul.INT8_ROWS_BESIDE_BF16[-1])
        assert layer.batched.rows == (rows if rows > few else 0)
        expected = _bf16_input_reference(x, layer, linear.bias)
        # the copy is the kernel's weight rounded once more, to bf16 (relative 2^-9)
        torch.testing.assert_close(y, expected, atol=2e-2, rtol=2e-2)


def _no_bf16_units(monkeypatch) -> None:
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)


def test_without_bf16_units_every_row_takes_the_weight_only_kernel(monkeypatch):
    _no_bf16_units(monkeypatch)
    torch.manual_seed(0)
    linear = nn.Linear(64, 40, bias=False)
    x = torch.randn(8, 64)
    for layer in (Int8WeightOnlyLinear(linear), Int4WeightOnlyLinear(linear, 32)):
        assert layer.batched is None
        torch.testing.assert_close(
            layer(x), _bf16_input_reference(x, layer, None), atol=2e-2, rtol=2e-2
        )


@pytest.mark.parametrize("rows", [16, 17, 300])
def test_without_bf16_units_many_int8_rows_multiply_the_dequantized_weight(monkeypatch, rows):
    """From DEQUANTIZED_MIN_ROWS rows the int8 layer multiplies fp32 activations by its weight
    dequantized slice by slice (here 600 output channels: 3 slices, the last partial): the
    result is the fp32 product with the exact stored weight, not the bf16-activation kernel's.
    Fewer rows take Kiln's int8 op (the same product) where it builds, else torch's kernel."""
    _no_bf16_units(monkeypatch)
    torch.manual_seed(rows)
    linear = nn.Linear(64, 600, bias=True)
    layer = Int8WeightOnlyLinear(linear)
    x = torch.randn(rows, 64)
    exact = F.linear(x, layer.dequantized(), linear.bias)
    kernel = _bf16_input_reference(x, layer, linear.bias)
    y = layer(x)
    if rows >= DEQUANTIZED_MIN_ROWS or layer.own_kernel:  # Kiln's int8 op: fp32 activations
        torch.testing.assert_close(y, exact, atol=1e-5, rtol=1e-5)
        assert (kernel - exact).abs().max() > 1e-3  # the bf16 path would be told apart
    else:
        torch.testing.assert_close(y, kernel, atol=2e-2, rtol=2e-2)


def test_a_quantized_model_deep_copies_with_its_packed_copies():
    torch.manual_seed(0)
    model = quantize_model(tiny_model("llama", 320), "int8")
    twin = copy.deepcopy(model)
    tokens = torch.randint(0, 320, (2, 6))  # 12 rows: the packed copies where there are any
    assert torch.equal(model(tokens), twin(tokens))


def test_int4_recovers_a_weight_already_on_a_16_level_grid():
    """A Q4_1 GGUF's weights (16 levels between each group's min and max, as SmolLM2 ships)
    come back up to the bf16 rounding of their scale and zero."""
    torch.manual_seed(0)
    low, step = torch.randn(48, 2, 1) * 0.02, torch.rand(48, 2, 1) * 0.01 + 0.002
    codes = torch.randint(0, 16, (48, 2, 32))
    codes[..., 0], codes[..., 1] = 0, 15  # every group spans its whole grid
    linear = nn.Linear(64, 48, bias=False)
    linear.weight.data = (low + step * codes).view(48, 64)
    error = (Int4WeightOnlyLinear(linear, 32).dequantized() - linear.weight).abs()
    assert (error.view(48, 2, 32) < 0.15 * step).all()  # symmetric amax/7 codes: up to 3 steps


def test_quantize_model_swaps_linears_outside_experts_and_decodes():
    torch.manual_seed(0)
    model = tiny_model("mixtral", 320)
    reference = copy.deepcopy(model)
    quantize_model(model, "int8")
    plain = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    assert plain and all(".moe." in name for name in plain)  # router and experts stay
    quantized = [m for m in model.modules() if isinstance(m, Int8WeightOnlyLinear)]
    assert len(quantized) == 2 * 4 + 1  # wq wk wv wo of each block, and the head
    assert model.tok_embeddings.weight.dtype == torch.float32  # the KV cache follows it
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    out = _greedy(model, prompts, 8)
    assert [len(o) for o in out] == [8, 8]
    assert _agreement(_greedy(reference, prompts, 8), out) > 0


def test_misuse_is_a_config_error_that_names_the_field():
    model = tiny_model("llama", 320)  # dim 32, feed-forward 64
    with pytest.raises(ConfigError, match="quantize_group_size: 64 does not divide"):
        quantize_model(copy.deepcopy(model), "int4", group_size=64)
    with pytest.raises(ConfigError, match="quantize_group_size: 48 is not one of"):
        quantize_model(copy.deepcopy(model), "int4", group_size=48)
    with pytest.raises(ConfigError, match="quantize: 'int3' is not one of"):
        quantize_model(copy.deepcopy(model), "int3")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="fp8 needs a CUDA GPU of compute capability 8.9"):
            quantize_model(copy.deepcopy(model), "fp8")
