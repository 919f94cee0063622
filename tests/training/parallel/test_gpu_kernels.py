"""CUDA-only (skipped without a GPU; `bench/gpu_check.sh` runs them): ring attention's CUDA block
kernels against SDPA, and activation offload's side-stream copies against no offload."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from kiln.training.parallel import ring_attention_fused as fused
from kiln.training.parallel.activation_offload import StreamCopier, apply_activation_offload
from kiln.training.parallel.ring_attention import ring_attention

pytestmark = pytest.mark.gpu


def _sdpa_reference(q, k, v, window):
    i = torch.arange(q.shape[2], device=q.device)[:, None]
    j = torch.arange(q.shape[2], device=q.device)[None, :]
    mask = (j <= i) & ((i - j) < window if window is not None else True)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True
    )


@pytest.fixture
def one_rank_group(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("dtype", "window", "tol"),
    [(torch.bfloat16, None, 3e-2), (torch.bfloat16, 100, 3e-2), (torch.float32, 100, 1e-4)],
)
def test_ring_cuda_kernels_match_sdpa(one_rank_group, dtype, window, tol):
    """One rank: both zig-zag chunks are local, so the ring runs masked diagonal blocks
    (efficient kernel) and, without causality, unmasked ones (flash in bf16)."""
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, h, 512, 64, device="cuda", dtype=dtype, requires_grad=True)
        for h in (8, 2, 2)
    )
    assert fused.fused_kernel_available(q.device, dtype)
    out = ring_attention(q, k, v, one_rank_group, window=window)
    ref = _sdpa_reference(q.float(), k.float(), v.float(), window)
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=5 * tol, rtol=5 * tol)


def test_ring_cuda_flash_blocks_match_sdpa_without_causality(one_rank_group):
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    out = ring_attention(q, k, v, one_rank_group, causal=False)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    (out.float().sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_activation_offload_streams_keep_gradients():
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleDict(
        {str(i): nn.Sequential(nn.Linear(256, 256), nn.GELU()) for i in range(4)}
    ).cuda()
    x = torch.randn(64, 256, device="cuda")

    def grads():
        model.zero_grad()
        h = x
        for block in model.layers.values():
            h = block(h)
        h.square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    reference = grads()
    hooks = apply_activation_offload(model)
    offloaded = grads()
    assert any(isinstance(c, StreamCopier) for c in hooks.copiers.values())
    for a, b in zip(offloaded, reference, strict=True):
        torch.testing.assert_close(a, b)
