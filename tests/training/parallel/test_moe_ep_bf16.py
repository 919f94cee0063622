"""Expert parallelism under a bf16 policy: fp32 expert weights (FSDP's ignored_params) compute
in bf16 on 2 gloo ranks, and their fp32 gradients match the fp32 single-process run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.model.moe import MoE
from kiln.training.parallel.expert_parallel import apply_expert_parallel
from tests.training.distributed import run_distributed
from tests.training.parallel._moe_cases import expert_grad_pairs

GEMMS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten._grouped_mm.default"}


class _GemmDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.dtypes: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in GEMMS:
            self.dtypes |= {str(a.dtype) for a in args[:2]}
        return func(*args, **(kwargs or {}))


def ep_bf16_vs_fp32() -> tuple[str, set[str], set[str], float, float]:
    rank, ep = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",))
    torch.manual_seed(0)
    ref = MoE(16, 32, 4, 2)
    x = torch.randn(ep, 2, 8, 16)
    (sum(ref(x[r]).pow(2).sum() for r in range(ep)) / ep).backward()

    moe = apply_expert_parallel(copy.deepcopy(ref), mesh)
    moe.gate.to(torch.bfloat16)  # FSDP2's MixedPrecisionPolicy(param_dtype=bf16) casts the gate
    with _GemmDtypes() as gemms:
        out = moe(x[rank].bfloat16())
    out.float().pow(2).sum().backward()
    out_err = (out.float() - ref(x[rank])).abs().max().item()
    grad_err = max(
        ((g - r).abs().max() / r.abs().max()).item() for g, r in expert_grad_pairs(moe, ref)
    )
    grad_dtypes = {str(p.grad.dtype) for p in moe.experts.parameters()}
    return str(out.dtype), gemms.dtypes, grad_dtypes, out_err, grad_err


@pytest.mark.slow
def test_expert_parallel_bf16_policy():
    results = run_distributed(ep_bf16_vs_fp32, 2)
    for out_dtype, gemm_dtypes, grad_dtypes, out_err, grad_err in results:
        assert out_dtype == "torch.bfloat16"
        assert gemm_dtypes == {"torch.bfloat16"}  # the experts too (they computed in fp32)
        assert grad_dtypes == {"torch.float32"}  # fp32 master weights, fp32 gradients
        assert out_err < 0.05 and grad_err < 0.05  # bf16 rounding, not a wrong result
