"""CPU linear layers laid out once, at load, for the kernels that multiply them, as vLLM-CPU does.

bf16: a plain bf16 `F.linear` on CPU reaches oneDNN's AMX matmul, but reorders the weight into
oneDNN's blocked layout on every call: at SmolLM2's shapes that reorder is most of the call, and
bf16 decoding was only 1.2-1.6x fp32. `PackedBf16Linear` reorders once, at load
(`mkldnn._reorder_linear_weight`), and multiplies with `mkldnn._linear_pointwise`: 2-4x a plain
bf16 linear at 1-64 rows (`bench/serving_quantized.py --part kernels`).

fp32: MKL's sgemm multiplies `x @ W.T` (an [N, K] row-major weight, "NT") 1.3-2x slower at 4-64
rows than `x @ M` with M the same weight stored column-major ("NN"); a block's linears keep
their values and parameters but hold the weight column-major, and multiply decode-sized batches
through Kiln's own op where it builds (`DecodeLinear`, decode_matmul.py). The LM head (49152 x 576
for SmolLM2, tied to the embedding, whose row lookups want it row-major) gets a oneDNN-reordered
fp32 copy instead, vLLM-CPU's `onednn_mm` for unquantized weights (`bench/cpu_linear.py`). On
AMD CPUs with AVX-512 (Zen 4) oneDNN's fp32 kernels beat MKL's from 2 rows on, so there every
linear gets the oneDNN copy (`fp32_linears_on_onednn`).

`pack_for_cpu(model)` lays a CPU model's linears out so: bf16 packed when the CPU has bf16 matrix
instructions (`cpu_has_bf16_matmul`), fp32 where torch has oneDNN and MKL. Without bf16 units
(AVX2) a bf16 GEMM is emulated, 4-8x slower than fp32 from 8 rows on: a bf16 model's linears
then keep their bf16 weights (the memory asked for) but multiply more than two rows in fp32, the
weight upcast a slice at a time (`UpcastBf16Linear`). A bf16 model's elementwise work is laid out
with them: SwiGLU inside the packed gate/up matmuls (cpu_swiglu.py) and, on request, RMSNorm
compiled by inductor (cpu_norm.py). A packed weight is an opaque oneDNN tensor
(`PackedWeight`): the state dict still holds a plain `weight` (unpacked on save, repacked on
`load_state_dict`) and a deep copy repacks. A refit that writes into `state_dict()`'s tensors in
place reaches a column-major weight but not a packed copy: engines that refit (RL rollouts) do
not go through `pack_for_cpu`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import torch
from torch import nn

from kiln.model import decode_matmul
from kiln.model.cpu_norm import CompiledRMSNorm
from kiln.model.cpu_swiglu import PackedSwiGLU, can_fuse_swiglu
from kiln.model.moe import MoE
from kiln.model.norms import RMSNorm


def cpu_has_bf16_matmul() -> bool:
    """True when oneDNN is built in and the CPU has AMX tiles or AVX-512-BF16 (the flags
    vLLM-CPU checks too); torch's own probes, as its inductor uses them."""
    if not torch.backends.mkldnn.is_available():
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def cpu_has_fp32_packing() -> bool:
    """True when torch has oneDNN (the head's reordered copy) and MKL (column-major sgemm)."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available()


FP32_LAYOUT_ENV = "KILN_FP32_LAYOUT"  # "onednn" or "mkl": overrides fp32_linears_on_onednn


@functools.cache
def fp32_linears_on_onednn() -> bool:
    """Whether every linear of an fp32 model is packed for oneDNN rather than held column-major
    for MKL's sgemm (and Kiln's decode op). MKL is the faster on Intel CPUs and on AVX2-only AMD
    ones; on AMD CPUs with AVX-512 (Zen 4) oneDNN's AVX-512 kernels are 1.1-1.8x MKL's and the
    op's from 2 rows on (SmolLM2's 210 block linears, one thread, at 4 / 32 / 128 rows: 25.8 /
    74.7 / 258.5 ms against 47.3 / 95.0 / 301.9), 0.91x at one row."""
    choice = os.environ.get(FP32_LAYOUT_ENV, "").lower()
    if choice in ("onednn", "mkl"):
        return choice == "onednn"
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and _cpu_vendor() == "AuthenticAMD"


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


class PackedWeight:
    """A [N, K] weight in `dtype` (bf16 or fp32), reordered once into oneDNN's blocked layout
    for `matmul`. The reordered tensor is opaque (no storage to copy or save): a deep copy
    repacks the plain weight, and `module.to()` / `state_dict()` do not see it (not a buffer)."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().to(dtype).contiguous(), None
        )

    def plain(self) -> torch.Tensor:
        """The [N, K] weight in `dtype` (a copy)."""
        return self.packed.to_dense()

    def matmul(self, a: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """a [M, K] contiguous, in `dtype` -> a @ weight.T (+ bias), [M, N] in `dtype`."""
        return torch.ops.mkldnn._linear_pointwise(a, self.packed, bias, "none", [], "")

    def __deepcopy__(self, memo) -> PackedWeight:
        return PackedWeight(self.plain(), self.dtype)


PackedBf16Weight = PackedWeight  # its default dtype: the int8/int4 layers' bf16 copies

UPCAST_SLICE = 256  # output channels upcast at a time: 0.6 MB of fp32 at K = 576, in cache


def sliced_fp32_matmul(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] fp32 @ (weight * scales[:, None]).T for a [N, K] weight in a narrower dtype (bf16,
    int8), upcast to fp32 `UPCAST_SLICE` output channels at a time into one reused buffer: an
    fp32 GEMM's speed without keeping an fp32 copy (each output equals the product with the
    whole upcast weight). Inference only: no gradient flows through it."""
    weight = weight.detach()
    n = weight.shape[0]
    out = x.new_empty(x.shape[0], n)
    buffer = x.new_empty(min(n, UPCAST_SLICE), weight.shape[1])
    for lo in range(0, n, UPCAST_SLICE):
        hi = min(n, lo + UPCAST_SLICE)
        w = buffer[: hi - lo].copy_(weight[lo:hi])
        if scales is not None:
            w.mul_(scales[lo:hi, None])
        torch.matmul(x, w.t(), out=out[:, lo:hi])
    return out


class UpcastBf16Linear(nn.Linear):
    """A bf16 `nn.Linear` for CPUs without bf16 matrix units: up to `BF16_MAX_ROWS` rows through
    the plain bf16 kernel (a matrix-vector product, memory-bound: bf16's half-size weights win),
    more in fp32 by `sliced_fp32_matmul` (a [1536 x 576] layer at 8 / 32 rows: bf16 2.1 / 8.2 ms,
    upcast 0.9 / 1.7 ms, fp32 weights 0.5 / 1.2 ms). The same parameters as the layer it wraps."""

    BF16_MAX_ROWS = 2

    @classmethod
    def of(cls, linear: nn.Linear) -> UpcastBf16Linear:
        layer = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= self.BF16_MAX_ROWS:
            return super().forward(x)
        a = x.reshape(rows, self.in_features).float()
        y = sliced_fp32_matmul(a, self.weight)
        if self.bias is not None:
            y += self.bias
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


class DecodeLinear(nn.Linear):
    """An fp32 `nn.Linear` held column-major whose decode-sized batches
    (`decode_matmul.FP32_ROWS` rows) go through Kiln's decode matmul op, up to 1.3x MKL's NN sgemm
    there; other row counts through MKL. The same parameters as the layer it wraps."""

    @classmethod
    def of(cls, linear: nn.Linear) -> DecodeLinear:
        column_major(linear)
        layer = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        weight_kn = self.weight.t()  # [K, N], contiguous while the weight stays column-major
        if (
            rows not in decode_matmul.FP32_ROWS
            or x.dtype != torch.float32
            or self.weight.requires_grad
            or not weight_kn.is_contiguous()
        ):
            return super().forward(x)
        y = decode_matmul.fp32_mm(x.reshape(rows, self.in_features), weight_kn)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)


class PackedLinear(nn.Module):
    """`nn.Linear` in `dtype` with its weight reordered once into oneDNN's blocked layout;
    inputs of another dtype are cast to it and the output back."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = dtype
        self.packed_weight = PackedWeight(linear.weight, dtype)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The plain [N, K] weight (a copy; for the chunked loss and the state dict)."""
        return self.packed_weight.plain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        y = self.packed_weight.matmul(a, self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        if prefix + "weight" in state_dict:  # a weight refit: repack the new values
            self.packed_weight = PackedWeight(state_dict[prefix + "weight"], self.dtype)
            state_dict = {k: v for k, v in state_dict.items() if k != prefix + "weight"}
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"in_features={self.in_features}, out_features={self.out_features}, {dtype} packed"


class PackedBf16Linear(PackedLinear):
    """`nn.Linear` in bf16 with its weight reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear, torch.bfloat16)


def linear_layers(model: nn.Module) -> Iterator[tuple[tuple[nn.Module, str], nn.Linear]]:
    """((parent, attribute name), linear) for every plain `nn.Linear` of `model` outside a
    mixture of experts (its router is tiny; its experts are 3-D weights, not linear layers)."""
    for parent in model.modules():
        if isinstance(parent, MoE):
            continue
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                yield (parent, name), child


def column_major(linear: nn.Linear) -> None:
    """Hold `linear`'s weight column-major: the same [N, K] values and parameter, strides
    (1, N), so `F.linear` multiplies by a contiguous [K, N] matrix (MKL's "NN" sgemm)."""
    if linear.weight.stride(0) != 1:
        linear.weight.data = linear.weight.detach().t().contiguous().t()


def children_where(model: nn.Module, keep) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, child) for every module of `model` for which `keep(child)`."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if keep(child)
    ]


def pack_for_cpu(model: nn.Module, compile_norms: bool = False) -> bool:
    """Lay a CPU model's linear layers out for the CPU's kernels in place. bf16 with bf16 matrix
    units: linears packed (`PackedBf16Linear`), SwiGLU's silu and product in the gate/up
    matmuls (`PackedSwiGLU`) and, with `compile_norms`, RMSNorms compiled by inductor for
    prefill-sized steps (`CompiledRMSNorm`, compiled here: 5-20 s once per process). bf16
    without them: linears that multiply many rows in fp32 (`UpcastBf16Linear`). fp32: linears
    column-major, the LM head (`model.output`) packed (every linear packed, SwiGLU fused, where
    `fp32_linears_on_onednn`). Returns whether it did (False: another dtype, device or CPU)."""
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        return False
    if weight.dtype == torch.bfloat16 and cpu_has_bf16_matmul():
        for parent, name, linear in [(p, n, m) for (p, n), m in linear_layers(model)]:
            setattr(parent, name, PackedBf16Linear(linear))
        for parent, name, ffn in children_where(model, can_fuse_swiglu):
            setattr(parent, name, PackedSwiGLU(ffn))
        if compile_norms:
            norms = children_where(model, lambda m: type(m) is RMSNorm)
            for parent, name, norm in norms:
                setattr(parent, name, CompiledRMSNorm.of(norm))
            if norms:
                getattr(norms[0][0], norms[0][1]).warm_up()
    elif weight.dtype == torch.bfloat16:
        for parent, name, linear in [(p, n, m) for (p, n), m in linear_layers(model)]:
            setattr(parent, name, UpcastBf16Linear.of(linear))
    elif weight.dtype == torch.float32 and cpu_has_fp32_packing():
        head = getattr(model, "output", None)
        for parent, name, linear in [(p, n, m) for (p, n), m in linear_layers(model)]:
            if linear is head or fp32_linears_on_onednn():
                setattr(parent, name, PackedLinear(linear, torch.float32))
            elif decode_matmul.available():
                setattr(parent, name, DecodeLinear.of(linear))
            else:
                column_major(linear)
        for parent, name, ffn in children_where(model, can_fuse_swiglu):
            setattr(parent, name, PackedSwiGLU(ffn))
    else:
        return False
    model.eval().requires_grad_(False)
    return True
