"""bf16 RMSNorm for CPU serving, compiled by torch's inductor into one vectorised loop.

Eager, a bf16 `RMSNorm` is six passes over the rows (cast up, square, mean, rsqrt-scale, cast
down, weight): at a prefill step's 300+ rows of SmolLM2 it takes 2.5x what inductor's fused C++
loop takes (the same arithmetic: fp32 inside, the result rounded to bf16 once). Under ~64 rows a
compiled call's fixed cost (guards, the wrapper: ~30 us) outweighs the saving, so decode-sized
inputs stay eager. One compile covers every row count (dynamic shapes); it runs on the first
large input, or at load with `warm_up`. Where inductor cannot compile (no C++ compiler, a torch
without it) the eager path runs and a warning says why, once.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

import torch

from kiln.model.norms import RMSNorm

log = logging.getLogger(__name__)

COMPILE_MIN_ROWS = 64  # below this, eager is as fast as the compiled call's overhead


def rms_norm_low_precision(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm.forward`'s non-fp32 path (HF's LlamaRMSNorm): normalise in fp32, scale in x's
    dtype. What inductor compiles."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def cpp_compiler_available() -> bool:
    """Whether inductor's CPU backend has a C++ compiler to call ($CXX, g++, c++ or clang++)."""
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return any(name and shutil.which(name) for name in names)


class InductorKernel:
    """`fn` compiled by inductor (dynamic shapes: one compile for every row count), or `fn`
    itself when compiling is unavailable or fails (logged once)."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn
        self.compiled: Callable[..., torch.Tensor] | None = None
        if cpp_compiler_available():
            self.compiled = torch.compile(fn, dynamic=True)
        else:
            log.warning("no C++ compiler for torch.compile: %s runs eager", fn.__name__)

    def __call__(self, *args) -> torch.Tensor:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # noqa: BLE001 - any compile failure: eager is correct too
                log.warning(
                    "torch.compile of %s failed, eager from now on: %s", self.fn.__name__, e
                )
                self.compiled = None
        return self.fn(*args)


_kernels: dict[str, InductorKernel] = {}  # one per process: the compiled code is shared


def rms_norm_kernel() -> InductorKernel:
    if "rms_norm" not in _kernels:
        _kernels["rms_norm"] = InductorKernel(rms_norm_low_precision)
    return _kernels["rms_norm"]


class CompiledRMSNorm(RMSNorm):
    """`RMSNorm` whose bf16/fp16 inference inputs of `COMPILE_MIN_ROWS` rows or more run
    inductor's fused loop; everything else (fp32, gradients, decode-sized steps) as before."""

    @classmethod
    def of(cls, norm: RMSNorm) -> CompiledRMSNorm:
        """A CompiledRMSNorm sharing `norm`'s weight parameter."""
        compiled = cls(norm.weight.shape[0], norm.eps)
        compiled.weight = norm.weight
        return compiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.dtype != torch.float32
            and x.numel() >= COMPILE_MIN_ROWS * x.shape[-1]
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            return rms_norm_kernel()(x, self.weight, self.eps)
        return super().forward(x)

    def warm_up(self) -> None:
        """Compile now (at load) for this norm's dtype, both ranks the engine uses ([1, T, D]
        steps, [N, D] sampled rows) and the engine's inference mode (dynamo guards on it: a
        warm-up under no_grad would compile again on the first request), so no request waits."""
        weight = self.weight
        with torch.inference_mode():
            for shape in (
                (1, COMPILE_MIN_ROWS, weight.shape[0]),
                (COMPILE_MIN_ROWS, weight.shape[0]),
            ):
                self(torch.zeros(shape, dtype=weight.dtype, device=weight.device))
