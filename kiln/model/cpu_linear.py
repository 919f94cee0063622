"""bf16 linear layers packed for the CPU's matrix units (AMX, AVX-512-BF16), as vLLM-CPU does.

A plain bf16 `F.linear` on CPU reaches oneDNN's AMX matmul, but reorders the weight into
oneDNN's blocked layout on every call: at SmolLM2's shapes that reorder is most of the call, and
bf16 decoding was only 1.2-1.6x fp32. `PackedBf16Linear` reorders once, at load
(`mkldnn._reorder_linear_weight`), and multiplies with `mkldnn._linear_pointwise`: 2-4x a plain
bf16 linear at 1-64 rows (`bench/serving_quantized.py --part kernels`).

`pack_for_cpu(model)` swaps a bf16 model's `nn.Linear` layers for packed ones when the CPU has
bf16 matrix instructions (`cpu_has_bf16_matmul`); elsewhere the model is left as it is (without
bf16 units oneDNN would emulate bf16, slower than today's path). The packed weight is an opaque
oneDNN tensor (`PackedBf16Weight`): the state dict still holds a plain `weight` (unpacked on
save, repacked on load) and a deep copy repacks.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from kiln.model.moe import MoE


def cpu_has_bf16_matmul() -> bool:
    """True when oneDNN is built in and the CPU has AMX tiles or AVX-512-BF16 (the flags
    vLLM-CPU checks too); torch's own probes, as its inductor uses them."""
    if not torch.backends.mkldnn.is_available():
        return False
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


class PackedBf16Weight:
    """A [N, K] weight in bf16, reordered once into oneDNN's blocked layout for `matmul`. The
    reordered tensor is opaque (no storage to copy or save): a deep copy repacks the plain
    weight, and `module.to()` / `state_dict()` do not see it (it is not a buffer)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach().to(torch.bfloat16).contiguous(), None
        )

    def plain(self) -> torch.Tensor:
        """The [N, K] bf16 weight (a copy)."""
        return self.packed.to_dense()

    def matmul(self, a: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """a [M, K] contiguous bf16 -> a @ weight.T (+ bias), [M, N] bf16."""
        return torch.ops.mkldnn._linear_pointwise(a, self.packed, bias, "none", [], "")

    def __deepcopy__(self, memo) -> PackedBf16Weight:
        return PackedBf16Weight(self.plain())


class PackedBf16Linear(nn.Module):
    """`nn.Linear` in bf16 with its weight reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = PackedBf16Weight(linear.weight)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16))

    @property
    def weight(self) -> torch.Tensor:
        """The plain [N, K] bf16 weight (a copy; for the chunked loss and the state dict)."""
        return self.packed_weight.plain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = self.packed_weight.matmul(a, self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, *args) -> None:
        if prefix + "weight" in state_dict:  # a weight refit: repack the new values
            self.packed_weight = PackedBf16Weight(state_dict[prefix + "weight"])
            state_dict = {k: v for k, v in state_dict.items() if k != prefix + "weight"}
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 packed"


def linear_layers(model: nn.Module) -> Iterator[tuple[tuple[nn.Module, str], nn.Linear]]:
    """((parent, attribute name), linear) for every plain `nn.Linear` of `model` outside a
    mixture of experts (its router is tiny; its experts are 3-D weights, not linear layers)."""
    for parent in model.modules():
        if isinstance(parent, MoE):
            continue
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                yield (parent, name), child


def pack_for_cpu(model: nn.Module) -> bool:
    """Swap a bf16 CPU model's linear layers for `PackedBf16Linear` in place when the CPU has
    bf16 matrix units; return whether it did (False: another dtype, device or CPU)."""
    weight = next(model.parameters())
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return False
    if not cpu_has_bf16_matmul():
        return False
    for parent, name, linear in [(p, n, m) for (p, n), m in linear_layers(model)]:
        setattr(parent, name, PackedBf16Linear(linear))
    model.eval().requires_grad_(False)
    return True
