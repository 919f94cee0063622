"""PackedSwiGLU: SwiGLU's silu and product inside the packed bf16 gate/up matmuls."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kiln.model import ModelConfig, Transformer
from kiln.model.cpu_linear import PackedBf16Linear, cpu_has_bf16_matmul, pack_for_cpu
from kiln.model.cpu_swiglu import PackedSwiGLU, can_fuse_swiglu
from kiln.model.transformer import FeedForward

needs_bf16_units = pytest.mark.skipif(
    not cpu_has_bf16_matmul(), reason="this CPU has no AMX / AVX-512-BF16 (no packing)"
)


def _packed_ffn(seed: int = 0, activation: str = "silu") -> FeedForward:
    torch.manual_seed(seed)
    ffn = FeedForward(64, 160, activation).to(torch.bfloat16).requires_grad_(False)
    for name in ("w1", "w2", "w3"):
        setattr(ffn, name, PackedBf16Linear(getattr(ffn, name)))
    return ffn


def _fp32_reference(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    """The FFN on the bf16 weights and input with every intermediate kept in fp32."""
    w1, w2, w3 = (getattr(ffn, n).weight.float() for n in ("w1", "w2", "w3"))
    x = x.float()
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


@needs_bf16_units
@pytest.mark.parametrize("rows", [1, 8, 100])
def test_fused_swiglu_is_the_ffn_within_bf16_rounding(rows):
    ffn = _packed_ffn(rows)
    fused = PackedSwiGLU(copy.deepcopy(ffn))
    x = torch.randn(1, rows, 64).bfloat16()
    reference = _fp32_reference(ffn, x)
    got, plain = fused(x), ffn(x)
    assert got.dtype == torch.bfloat16 and got.shape == (1, rows, 64)
    scale = reference.abs().amax().item()
    # fewer bf16 roundings than the plain path: at least as close to the fp32 reference
    err_fused = (got.float() - reference).abs().amax().item()
    err_plain = (plain.float() - reference).abs().amax().item()
    assert err_fused <= 0.02 * scale, (err_fused, scale)
    assert err_fused <= 1.5 * err_plain + 1e-6, (err_fused, err_plain)


@needs_bf16_units
def test_a_hooked_gate_takes_the_plain_path():
    """A LoRA adapter's forward hook on w1 / w3 must still change the output."""
    ffn = _packed_ffn()
    fused = PackedSwiGLU(ffn)
    x = torch.randn(2, 5, 64).bfloat16()
    before = fused(x)
    handle = fused.w3.register_forward_hook(lambda module, args, out: out * 2)
    doubled = fused(x)
    handle.remove()
    expected = ffn.w2(F.silu(ffn.w1(x)) * (ffn.w3(x) * 2))
    assert torch.equal(doubled, expected)
    assert not torch.equal(doubled, before)


def test_only_packed_silu_ffns_fuse():
    assert not can_fuse_swiglu(FeedForward(64, 160))  # not packed
    if cpu_has_bf16_matmul():
        assert can_fuse_swiglu(_packed_ffn())
        assert not can_fuse_swiglu(_packed_ffn(activation="gelu_tanh"))
        assert not can_fuse_swiglu(PackedSwiGLU(_packed_ffn()))  # not twice
    with pytest.raises(ValueError, match="PackedSwiGLU"):
        PackedSwiGLU(FeedForward(64, 160))


@needs_bf16_units
def test_pack_for_cpu_fuses_every_swiglu_and_keeps_state_and_logits():
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden_dim=160
    )
    plain = Transformer(cfg).to(torch.bfloat16).eval().requires_grad_(False)
    packed = copy.deepcopy(plain)
    assert pack_for_cpu(packed)
    ffns = [layer.feed_forward for layer in packed.layers.values()]
    assert all(type(ffn) is PackedSwiGLU for ffn in ffns)
    assert plain.state_dict().keys() == packed.state_dict().keys()
    tokens = torch.randint(0, 96, (3, 20))
    ref, got = plain(tokens).float(), packed(tokens).float()
    torch.testing.assert_close(got, ref, rtol=0.02, atol=0.02 * ref.abs().amax().item())
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
