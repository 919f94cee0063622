"""Ring attention on aten's fused flash kernel (blocks return their log-sum-exp) and on the
fp32 matmul path both equal SDPA within 1e-5 in fp32, forward and backward; on CUDA each block
takes flash (unmasked, fp16/bf16, sm80+) or the memory-efficient kernel (masks, fp32)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from kiln.training.parallel import ring_attention_fused as fused
from kiln.training.parallel.ring_attention import ring_attention
from kiln.training.parallel.ring_attention_fused import block_kernel
from tests.training.distributed import run_distributed
from tests.training.parallel._ring_cases import ring_vs_sdpa


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "matmul"])
def test_ring_block_kernels_match_sdpa_on_two_ranks(fused):
    for errors in run_distributed(ring_vs_sdpa, 2, fused):
        assert len(errors) >= 5
        for case, err in errors:
            assert err < 1e-5, (case, err)


@pytest.mark.parametrize(
    ("device", "dtype", "masked", "capability", "kernel"),
    [
        ("cpu", torch.float32, True, None, "cpu_flash"),
        ("cuda", torch.bfloat16, False, (9, 0), "flash"),
        ("cuda", torch.bfloat16, True, (9, 0), "efficient"),  # flash takes no mask
        ("cuda", torch.float32, False, (9, 0), "efficient"),  # flash is fp16/bf16 only
        ("cuda", torch.float16, False, (7, 5), "efficient"),  # flash needs sm80+
        ("cuda", torch.bfloat16, True, (3, 7), None),  # matmul ring
        ("cuda", torch.bfloat16, True, None, None),  # no CUDA runtime
        ("mps", torch.float32, True, None, None),
    ],
)
def test_block_kernel_choice(device, dtype, masked, capability, kernel):
    assert block_kernel(device, dtype, masked, capability) == kernel


@pytest.mark.parametrize(
    ("dtype", "causal", "kernels"),
    [
        (torch.bfloat16, False, {"flash"}),
        (torch.bfloat16, True, {"efficient"}),
        (torch.float32, False, {"efficient"}),
    ],
)
def test_cuda_block_kernels_run_forward_and_backward_as_meta(dtype, causal, kernels):
    """The CUDA ops' meta implementations (their schemas and output shapes: the efficient
    kernel's padded log-sum-exp, flash's extra outputs handed to its backward, the GQA fold)
    stand in for an sm90 GPU; one rank of a fake group."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    used = []

    def spy(*args):
        used.append(block_kernel(*args))
        return used[-1]

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        with (
            mock.patch.object(fused, "_capability", lambda device: (9, 0)),
            mock.patch.object(fused, "_device_type", lambda device: "cuda"),
            mock.patch.object(fused, "block_kernel", spy),
        ):
            q = torch.empty(2, 8, 64, 32, device="meta", dtype=dtype, requires_grad=True)
            k = torch.empty(2, 2, 64, 32, device="meta", dtype=dtype, requires_grad=True)
            v = torch.empty(2, 2, 64, 32, device="meta", dtype=dtype, requires_grad=True)
            out = ring_attention(
                q, k, v, dist.group.WORLD, causal=causal, window=40 if causal else None
            )
            out.sum().backward()
    finally:
        dist.destroy_process_group()
    assert (out.shape, out.dtype) == (q.shape, dtype)
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    assert set(used[1:]) == kernels  # used[0]: fused_kernel_available's check
