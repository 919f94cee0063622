"""Weight-only quantization for serving: a model transform applied after the weights are loaded.

`quantize_model(model, "int8")` swaps every `nn.Linear` of a loaded `Transformer` (attention,
feed-forward, the LM head; not a mixture of experts' router and experts) for a module that keeps
its weight in fewer bits and multiplies through a packed-weight kernel:

* int8: symmetric, one scale per output channel; `aten._weight_int8pack_mm`.
* int4: asymmetric, a scale and a zero per `group_size` inputs of each output channel (as
  llama.cpp's Q4_1 and torchao's int4 weight-only); `aten._weight_int4pack_mm_for_cpu`.
* fp8: e4m3 weights with per-channel scales, activations scaled per row, `aten._scaled_mm`; CUDA
  GPUs of compute capability 8.9 or newer only.

With int4 the LM head is int8 (as llama.cpp's 4-bit files keep it at 6-8 bits).

The weight-only kernels are matrix-vector loops: fastest at 1-2 rows, then 2-10x slower than a
bf16 GEMM on AMX from 3 rows on (prefill, batched decoding). On a CPU with bf16 matrix units
(`cpu_linear.cpu_has_bf16_matmul`) each layer also keeps its dequantized weight in bf16, packed
for oneDNN, and multiplies more than `WEIGHT_ONLY_MAX_ROWS` rows through it: the same quantized
weights (rounded once more, to bf16), 3 bytes per weight with int8 (2.5 with int4) against
fp32's 4. Where Kiln's decode matmul op builds (decode_matmul.py: fp32 activations, 1.3-1.9x
torch's int8 kernel), int8 layers multiply their first rows through it instead: up to 4 beside
the packed bf16 copy, up to 32 without bf16 units (AVX2), where more rows multiply the weight
dequantized to fp32 a slice at a time (no copy kept). Dynamic int8 activations on AMX-INT8
(oneDNN's qlinear, vLLM-CPU's W8A8) were as fast but cost SmolLM2 1.7% perplexity (per-token
scales) against weight-only's 0.1%.

The CPU kernels take bf16 activations (with fp32 ones they fall back to a path 40-95x slower,
`bench/serving_quantized.py --part kernels`), so a layer casts its input to bf16 and its output
back. Activations are never quantized: dynamic int8 activations cost SmolLM2 3x its perplexity.
The embedding, the norms and the KV cache keep the model's dtype; a tied head gets its own
quantized copy.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from kiln.model import decode_matmul
from kiln.model.cpu_linear import (
    PackedBf16Weight,
    cpu_has_bf16_matmul,
    linear_layers,
    sliced_fp32_matmul,
)
from kiln.platform.errors import ConfigError

QuantMethod = Literal["int8", "int4", "fp8"]
METHODS: tuple[str, ...] = get_args(QuantMethod)
INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_ROWS = 16  # the int4 packing's granule of output channels
FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: the first GPUs with fp8 tensor cores
# rows a weight-only kernel takes; more go through the packed bf16 copy where there is one
# (a [1536 x 576] layer: int8 41 / 55 / 69 us at 1 / 2 / 3 rows, packed bf16 45 / 47 / 49 us;
# the [49152 x 576] head: int8 ahead up to 2 rows)
WEIGHT_ONLY_MAX_ROWS = 2
# Without bf16 units (AVX2) more rows than Kiln's decode op takes (or, where it did not build,
# than torch's int8 kernel keeps up with an fp32 GEMM at: ~16) multiply by the weight dequantized
# to fp32 a slice at a time, no fp32 copy kept (a [1536 x 576] layer at 32 / 128 rows: torch's
# int8 kernel 1.5 / 5.6 ms, sliced 1.2 / 3.3 ms, fp32 weights 0.9 / 2.8 ms)
DEQUANTIZED_MIN_ROWS = 17


def _weight_only_input(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x [..., K] as the contiguous bf16 [M, K] matrix the packed kernels read."""
    return x.reshape(-1, in_features).to(torch.bfloat16).contiguous()


def _batched_copy(layer: nn.Module) -> PackedBf16Weight | None:
    """The layer's dequantized weight packed for the CPU's bf16 units, or None without them."""
    if not cpu_has_bf16_matmul():
        return None
    return PackedBf16Weight(layer.dequantized(torch.bfloat16))


def _many_rows(layer: nn.Module, a: torch.Tensor) -> bool:
    return layer.batched is not None and a.shape[0] > WEIGHT_ONLY_MAX_ROWS


class Int8WeightOnlyLinear(nn.Module):
    """`nn.Linear` with an int8 weight [N, K] and a bf16 scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        # the scale is rounded to bf16 first so the codes are exact for the scale the kernel uses
        scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 127).to(torch.bfloat16)
        codes = torch.round(w / scale.float()[:, None]).clamp(-128, 127).to(torch.int8)
        self.register_buffer("qweight", codes.contiguous())
        self.register_buffer("scales", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.batched = _batched_copy(self)
        # Kiln's own op takes the few-row products (decode_matmul.py): with bf16 units as many
        # as it beats the packed bf16 copy at, without them those torch's kernel would take
        self.own_kernel = decode_matmul.available()
        self.register_buffer("fp32_scales", scale.float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        own_rows = (
            decode_matmul.INT8_ROWS if self.batched is None else decode_matmul.INT8_ROWS_BESIDE_BF16
        )
        if self.own_kernel and rows in own_rows:
            a = x.reshape(rows, self.in_features).float()
            y = decode_matmul.int8_mm(a, self.qweight, self.fp32_scales)
        elif self.batched is None and rows >= DEQUANTIZED_MIN_ROWS:
            a = x.reshape(rows, self.in_features).float()
            y = sliced_fp32_matmul(a, self.qweight, self.fp32_scales)
        else:
            a = _weight_only_input(x, self.in_features)
            if _many_rows(self, a):
                y = self.batched.matmul(a)
            else:
                y = torch.ops.aten._weight_int8pack_mm(a, self.qweight, self.scales)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the kernel multiplies by, [N, K] (exact in fp32, rounded once in bf16)."""
        return (self.qweight.float() * self.scales.float()[:, None]).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int4WeightOnlyLinear(nn.Module):
    """`nn.Linear` with a 4-bit weight packed for the CPU kernel: each group of `group_size`
    inputs of an output channel spans its own [min, max] in 16 levels (asymmetric, as llama.cpp's
    Q4_1 and torchao's int4: a GGUF Q4_1 model's weights come back exactly, up to bf16)."""

    def __init__(self, linear: nn.Linear, group_size: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size = group_size
        # the packing wants N in multiples of 16: pad with zero rows, cut the output back
        k = self.in_features
        n = -(-self.out_features // INT4_ROWS) * INT4_ROWS
        w = linear.weight.detach().float()
        w = torch.cat([w, w.new_zeros(n - self.out_features, k)]).view(n, -1, group_size)
        low, high = w.amin(dim=-1), w.amax(dim=-1)  # [N, K/G]
        # the kernel computes (code - 8) * scale + zero; both are rounded to bf16 before the
        # codes are chosen, so the codes are the nearest for the values the kernel uses
        scale = ((high - low).clamp(min=1e-12) / 15).to(torch.bfloat16)
        zero = (low + 8 * scale.float()).to(torch.bfloat16)
        offset = zero.float() - 8 * scale.float()  # the value of code 0
        codes = torch.round((w - offset[..., None]) / scale.float()[..., None]).clamp(0, 15)
        codes = codes.to(torch.int32).view(n, k).contiguous()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        self.register_buffer("qweight", packed)
        # the kernel's layout: [K/G, N, (scale, zero)]
        scales_and_zeros = torch.stack([scale, zero], -1).transpose(0, 1)
        self.register_buffer("scales_and_zeros", scales_and_zeros.contiguous())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.batched = _batched_copy(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = _weight_only_input(x, self.in_features)
        if _many_rows(self, a):
            y = self.batched.matmul(a)  # already out_features wide
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                a, self.qweight, self.group_size, self.scales_and_zeros
            )[:, : self.out_features]
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight the kernel multiplies by, [N, K] (the identity times the packed weight,
        through the kernel itself: the packed layout is the kernel's own). fp32: exact, but the
        kernel's slow fp32 path (seconds per layer); bf16: rounded once, milliseconds."""
        eye = torch.eye(self.in_features, dtype=dtype)
        scales_and_zeros = self.scales_and_zeros.to(dtype)
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(
            eye, self.qweight, self.group_size, scales_and_zeros
        )
        return w_t[:, : self.out_features].t().contiguous()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4, group_size={self.group_size}"
        )


class Fp8Linear(nn.Module):
    """`nn.Linear` with an e4m3 weight and an fp32 scale per output channel; each activation row
    is scaled into e4m3 as it comes (vLLM's dynamic per-token fp8), multiplied by `_scaled_mm`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        fp8_max = torch.finfo(torch.float8_e4m3fn).max
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / fp8_max
        # _scaled_mm wants its second operand column-major: store W^T as a [K, N] view of W
        self.register_buffer("qweight", (w / scale[:, None]).to(torch.float8_e4m3fn))
        self.register_buffer("scales", scale[None, :].contiguous())  # [1, N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.in_features)
        fp8_max = torch.finfo(torch.float8_e4m3fn).max
        row_scale = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8_max
        a8 = (a.float() / row_scale).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(a8, self.qweight.t(), row_scale, self.scales, out_dtype=torch.bfloat16)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def check_method(method: str, group_size: int, device: torch.device | str | None) -> None:
    """Raise ConfigError unless `method` can run on `device` (fp8: a CUDA GPU of capability 8.9+;
    int8/int4: the CPU, where the packed kernels live)."""
    if method not in METHODS:
        raise ConfigError(f"quantize: {method!r} is not one of {', '.join(METHODS)}")
    device = torch.device(device or "cpu")
    if method == "fp8":
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError(
                "quantize: fp8 needs a CUDA GPU of compute capability 8.9+ (Ada, Hopper); "
                f"this model is on {device.type} - use int8 or int4 on CPU"
            )
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            raise ConfigError(
                f"quantize: fp8 needs compute capability 8.9+; {torch.cuda.get_device_name(device)}"
                f" has {capability[0]}.{capability[1]}"
            )
        return
    if device.type != "cpu":
        raise ConfigError(f"quantize: {method} runs on CPU (packed CPU kernels); use fp8 on GPUs")
    if method == "int4" and group_size not in INT4_GROUP_SIZES:
        sizes = ", ".join(map(str, INT4_GROUP_SIZES))
        raise ConfigError(f"quantize_group_size: {group_size} is not one of {sizes}")


def quantized_linear(linear: nn.Linear, method: str, group_size: int) -> nn.Module:
    if method == "int8":
        return Int8WeightOnlyLinear(linear)
    if method == "int4":
        return Int4WeightOnlyLinear(linear, group_size)
    return Fp8Linear(linear)


def quantize_model(model: nn.Module, method: str, *, group_size: int = 32) -> nn.Module:
    """Swap `model`'s linear layers for quantized ones in place (see the module docstring) and
    return it; for inference only (the quantized weights are buffers, not parameters)."""
    device = next(model.parameters()).device
    check_method(method, group_size, device)
    if method == "int4":
        widths = sorted(
            {m.in_features for _, m in linear_layers(model) if m.in_features % group_size}
        )
        if widths:
            raise ConfigError(
                f"quantize_group_size: {group_size} does not divide the input width of every "
                f"layer (widths {widths}); pick a smaller group size"
            )
    for parent, name, linear in [(p, n, m) for (p, n), m in linear_layers(model)]:
        # int4 keeps the LM head at int8, as llama.cpp keeps output.weight at Q6_K/Q8_0 in its
        # 4-bit files: SmolLM2's held-out perplexity is 1.06x fp32 with an int4 head, 1.004x so
        head = parent is model and name == "output"
        layer_method = "int8" if method == "int4" and head else method
        setattr(parent, name, quantized_linear(linear, layer_method, group_size).to(device))
    return model.eval().requires_grad_(False)
