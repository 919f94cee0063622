"""CompiledRMSNorm: inductor's fused RMSNorm for large bf16 steps, eager otherwise or without a
compiler."""

from __future__ import annotations

import logging

import pytest
import torch

from kiln.model import cpu_norm
from kiln.model.cpu_norm import (
    COMPILE_MIN_ROWS,
    CompiledRMSNorm,
    InductorKernel,
    rms_norm_low_precision,
)
from kiln.model.norms import RMSNorm

needs_compiler = pytest.mark.skipif(
    not cpu_norm.cpp_compiler_available(), reason="no C++ compiler for inductor"
)


def _norms(dim: int = 96) -> tuple[RMSNorm, CompiledRMSNorm]:
    torch.manual_seed(dim)
    norm = RMSNorm(dim).bfloat16().requires_grad_(False)
    norm.weight.normal_()
    return norm, CompiledRMSNorm.of(norm)


def test_the_compiled_function_is_rmsnorms_low_precision_path():
    norm, _ = _norms()
    x = torch.randn(3, 7, 96).bfloat16()
    assert torch.equal(rms_norm_low_precision(x, norm.weight, norm.eps), norm(x))


def test_small_steps_fp32_and_gradients_stay_eager(monkeypatch):
    norm, compiled = _norms()
    assert compiled.weight is norm.weight  # shared, not copied

    def refuse(*args):
        raise AssertionError("the compiled kernel ran")

    monkeypatch.setitem(cpu_norm._kernels, "rms_norm", refuse)
    small = torch.randn(1, COMPILE_MIN_ROWS - 1, 96).bfloat16()
    assert torch.equal(compiled(small), norm(small))
    fp32 = RMSNorm(96)
    x32 = torch.randn(1, 200, 96)
    assert torch.equal(CompiledRMSNorm.of(fp32)(x32), fp32(x32))
    trained = CompiledRMSNorm.of(RMSNorm(96).bfloat16())  # weight requires grad
    trained(torch.randn(1, 200, 96).bfloat16()).sum().backward()
    assert trained.weight.grad is not None


@pytest.mark.slow  # inductor's first compile: 8-20 s on this 2-core machine
@needs_compiler
def test_large_steps_compile_once_and_match_eager_within_one_rounding():
    norm, compiled = _norms()
    torch._dynamo.reset()
    cpu_norm._kernels.clear()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for rows in (COMPILE_MIN_ROWS, 100, 333):  # one compile for every row count
        x = torch.randn(1, rows, 96).bfloat16() * 3
        got, ref = compiled(x), norm(x)
        # fp32 inside both: at most the last bf16 rounding (and the weight product's) apart
        torch.testing.assert_close(got, ref, rtol=2**-7, atol=2**-7)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 1
    assert cpu_norm._kernels["rms_norm"].compiled is not None


def test_no_compiler_runs_eager_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(cpu_norm, "cpp_compiler_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="kiln.model.cpu_norm"):
        kernel = InductorKernel(rms_norm_low_precision)
    assert kernel.compiled is None and "no C++ compiler" in caplog.text
    norm, _ = _norms()
    x = torch.randn(1, 200, 96).bfloat16()
    assert torch.equal(kernel(x, norm.weight, norm.eps), norm(x))


def test_a_failing_compile_falls_back_to_eager_once(caplog):
    kernel = InductorKernel(rms_norm_low_precision)
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("inductor: cannot build")

    kernel.compiled = broken
    norm, _ = _norms()
    x = torch.randn(1, 200, 96).bfloat16()
    with caplog.at_level(logging.WARNING, logger="kiln.model.cpu_norm"):
        assert torch.equal(kernel(x, norm.weight, norm.eps), norm(x))
        assert torch.equal(kernel(x, norm.weight, norm.eps), norm(x))
    assert len(calls) == 1 and kernel.compiled is None
    assert caplog.text.count("cannot build") == 1
