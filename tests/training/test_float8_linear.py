"""torchao's Float8Linear as kiln converts it, on the CPU (torch's oneDNN `_scaled_mm`): forward
and both gradients equal an emulation of the recipe (each GEMM operand scaled by its amax, cast
to float8 and back, then an fp32 matmul) and stay within fp8's error of the bf16 Linear."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kiln.training.float8 import convert_to_float8

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# the recipes as torchao defines them: (grad_output's dtype, power-of-2 scales)
RECIPES = {"tensorwise": (E5M2, False), "rowwise": (E4M3, True)}
# ||fp8 - bf16|| / ||bf16||, measured 0.038-0.040 forward, 0.058 (e5m2) and 0.039 (e4m3) for the
# gradients: e4m3 rounds each operand to 3 mantissa bits (~0.036 RMS), e5m2 to 2
FORWARD_TOLERANCE = 0.06
GRAD_TOLERANCE = {"tensorwise": 0.09, "rowwise": 0.06}
# against the emulation only the bf16 rounding of the outputs differs (measured 0.0017)
EMULATION_TOLERANCE = 4e-3


def fake_quantise(x: torch.Tensor, dtype, reduce_dim: int | None, pow2: bool) -> torch.Tensor:
    """x as float8 `dtype` sees it, back in fp32: scaled so its amax (whole tensor, or along the
    GEMM's reduction dim `reduce_dim`) lands on the format's maximum, cast, unscaled."""
    x = x.float()
    amax = x.abs().amax() if reduce_dim is None else x.abs().amax(dim=reduce_dim, keepdim=True)
    scale = torch.finfo(dtype).max / amax.clamp(min=1e-12)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return (x * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype).float() / (
        scale
    )


def emulated_linear(x, w, grad_out, recipe: str):
    """(y, grad_x, grad_w) of y = x @ w.T with every GEMM's operands fake-quantised: tensorwise,
    or each operand along the dimension its GEMM sums over (rowwise)."""
    go_dtype, pow2 = RECIPES[recipe]
    rows = recipe == "rowwise"

    def q(t, dtype, dim):
        return fake_quantise(t, dtype, dim if rows else None, pow2)

    y = q(x, E4M3, -1) @ q(w, E4M3, -1).T  # sums over in_features
    grad_x = q(grad_out, go_dtype, -1) @ q(w, E4M3, 0)  # over out_features
    grad_w = q(grad_out, go_dtype, 0).T @ q(x, E4M3, 0)  # over tokens
    return y, grad_x, grad_w


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


class Block(nn.Module):
    """The shape `fp8_linear_names` picks from: one block Linear under `layers`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.layers = nn.ModuleDict({"0": nn.ModuleDict({"proj": linear})})


def linear_pair(recipe: str, in_features=128, out_features=64, bias=False):
    """(bf16 nn.Linear, its Float8Linear copy) on the same weights."""
    torch.manual_seed(0)
    plain = nn.Linear(in_features, out_features, bias=bias, dtype=torch.bfloat16)
    holder = Block(copy.deepcopy(plain))
    assert convert_to_float8(holder, recipe) == ["layers.0.proj"]
    fp8 = holder.layers["0"]["proj"]
    assert type(fp8).__name__ == "Float8Linear" and isinstance(fp8, nn.Linear)
    return plain, fp8


def run(linear: nn.Module, x: torch.Tensor, grad_out: torch.Tensor):
    x = x.clone().requires_grad_(True)
    y = linear(x)
    y.backward(grad_out)
    return y.detach(), x.grad, linear.weight.grad


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_float8_linear_equals_the_emulated_recipe_and_is_near_bf16(recipe):
    plain, fp8 = linear_pair(recipe)
    g = torch.Generator().manual_seed(1)
    # outliers in a few channels, where one scale per tensor and one per row differ
    x = torch.randn(4, 32, 128, generator=g) * (1 + 20 * (torch.rand(128, generator=g) > 0.95))
    x = x.bfloat16()
    grad_out = (torch.randn(4, 32, 64, generator=g) * 1e-3).bfloat16()

    got = run(fp8, x, grad_out)
    want = emulated_linear(x.reshape(-1, 128), fp8.weight, grad_out.reshape(-1, 64), recipe)
    for name, a, b in zip(("y", "grad_x", "grad_w"), got, want, strict=True):
        # bf16 outputs of the same fp8 products: within bf16 rounding of the emulation
        err = relative_error(a.reshape(b.shape), b)
        assert err < EMULATION_TOLERANCE, (name, err)

    bf16 = run(plain, x, grad_out)
    assert relative_error(got[0], bf16[0]) < FORWARD_TOLERANCE
    assert relative_error(got[1], bf16[1]) < GRAD_TOLERANCE[recipe]
    assert relative_error(got[2], bf16[2]) < GRAD_TOLERANCE[recipe]
    # and fp8 did round: the bf16 Linear is not what ran
    assert relative_error(got[0], bf16[0]) > 5 * EMULATION_TOLERANCE


def test_linears_whose_shards_break_the_fp8_shape_rule_stay_bf16():
    # 48 rows split over tp=2 leave 24 per rank: not a multiple of 16
    holder = Block(nn.Linear(64, 48, bias=False))
    assert convert_to_float8(copy.deepcopy(holder), "tensorwise", tp=1) == ["layers.0.proj"]
    assert convert_to_float8(holder, "tensorwise", tp=2) == []
    assert type(holder.layers["0"]["proj"]) is nn.Linear


def test_selective_recompute_keeps_the_fp8_gemms():
    """Op-level selective recompute keeps the fp8 GEMMs' outputs: backward reruns none of the
    forward's (3 GEMMs per Linear in all; 4 when the forward's is recomputed). A mode sees them
    as `aten.mm` on torchao's float8 tensors, before their dispatch turns them into _scaled_mm."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    from kiln.training.parallel.activation_checkpoint import _op_policy_context

    class CountGemms(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten._scaled_mm.default):
                self.calls += 1
            return func(*args, **(kwargs or {}))

    _, fp8 = linear_pair("tensorwise")
    x = torch.randn(32, 128, dtype=torch.bfloat16, requires_grad=True)

    def gemms(**policy) -> int:
        with CountGemms() as count:
            y = checkpoint(lambda t: torch.relu(fp8(t)), x, use_reentrant=False, **policy)
            y.float().sum().backward()
        return count.calls

    assert gemms(context_fn=_op_policy_context) == 3
    assert gemms() == 4  # full recompute: the forward GEMM runs again
