"""MoE speed paths: grouped GEMM = per-expert loop, compute in the policy's dtype, host syncs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.model.moe import MoE, grouped_mm_usable, grouped_swiglu

GEMMS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten._grouped_mm.default"}


class _OpLog(TorchDispatchMode):
    """Records every aten op with its tensor arguments' dtypes, and `Tensor.tolist` calls
    (tolist reads the host copy without dispatching an op)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        super().__init__()
        self.ops: list[tuple[str, tuple, dict]] = []
        self.tolist_calls = 0
        original = torch.Tensor.tolist

        def counting_tolist(tensor):
            self.tolist_calls += 1
            return original(tensor)

        monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), args, kwargs or {}))
        return func(*args, **(kwargs or {}))

    def gemm_dtypes(self) -> set[torch.dtype]:
        return {a.dtype for name, args, _ in self.ops if name in GEMMS for a in args[:2]}

    def host_syncs(self) -> int:
        """Ops that read a device value back to the host before they can return."""
        return self.tolist_calls + sum(_syncs(*op) for op in self.ops)


def _syncs(name: str, args: tuple, kwargs: dict) -> bool:
    if name in ("aten._local_scalar_dense.default", "aten.bincount.default"):
        return True
    if name.startswith("aten.nonzero"):
        return True
    if name == "aten.index.Tensor":  # boolean masks: the output size is data-dependent
        return any(i is not None and i.dtype == torch.bool for i in args[1])
    return name == "aten.repeat_interleave.Tensor" and kwargs.get("output_size") is None


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
@pytest.mark.parametrize(("capacity", "max_syncs"), [(None, 0), (1.0, 1)])
def test_moe_layer_host_syncs(monkeypatch, capacity, max_syncs):
    """At most one device-to-host read per layer (none without a capacity): each one stalls
    the CPU until the GPU queue drains."""
    torch.manual_seed(0)
    moe = MoE(16, 24, n_experts=4, top_k=2, capacity_factor=capacity)
    x = torch.randn(2, 8, 16)
    with _OpLog(monkeypatch) as log:
        moe(x)
    assert log.host_syncs() <= max_syncs


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
@pytest.mark.parametrize("counts", [[3, 0, 9, 4], [0, 0, 16, 0], [0, 0, 0, 0]])
def test_grouped_gemm_matches_expert_loop(counts):
    torch.manual_seed(0)
    experts = MoE(16, 24, n_experts=4, top_k=1).experts
    twin = copy.deepcopy(experts)
    x = torch.randn(sum(counts), 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    n = torch.tensor(counts)
    assert grouped_mm_usable(x.device, x.dtype, 16, 24)
    y = grouped_swiglu(experts.w13, experts.w2, x, n, use_grouped=True)
    ref = grouped_swiglu(twin.w13, twin.w2, x2, n, use_grouped=False)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=0)
    w = torch.randn_like(ref)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    if sum(counts):
        torch.testing.assert_close(x.grad, x2.grad, atol=1e-5, rtol=0)
    for p, q in zip(experts.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=0)


def test_fp32_experts_compute_in_bf16_policy_dtype(monkeypatch):
    """Expert-parallel experts are FSDP's ignored_params: their weights stay fp32 while the
    policy casts everything else (the gate, the activations) to bf16. They must compute in bf16
    and hand fp32 gradients to their fp32 weights (the old loop raised a dtype mismatch here,
    and the EP path computed in fp32)."""
    torch.manual_seed(0)
    ref = MoE(16, 24, n_experts=4, top_k=2)
    moe = copy.deepcopy(ref)
    moe.gate.to(torch.bfloat16)  # what FSDP2's MixedPrecisionPolicy(param_dtype=bf16) does
    x = torch.randn(2, 8, 16)
    with _OpLog(monkeypatch) as log:
        out = moe(x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert log.gemm_dtypes() == {torch.bfloat16}
    out.float().pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for p, q in zip(moe.experts.parameters(), ref.experts.parameters(), strict=True):
        assert p.dtype == p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, atol=0.05, rtol=0.05)
    torch.testing.assert_close(out.float(), ref(x), atol=0.03, rtol=0.03)


def test_bf16_autocast_runs_expert_gemms_in_bf16(monkeypatch):
    torch.manual_seed(0)
    moe = MoE(16, 32, n_experts=4, top_k=2)
    with torch.autocast("cpu", dtype=torch.bfloat16), _OpLog(monkeypatch) as log:
        out = moe(torch.randn(2, 8, 16))
    assert out.dtype == torch.float32  # the residual stream's dtype
    assert torch.bfloat16 in log.gemm_dtypes()
    assert sum(1 for name, _, _ in log.ops if name == "aten._grouped_mm.default") == 2
