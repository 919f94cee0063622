"""Op-level selective recompute keeps attention outputs but not ring attention's S x S score
matmuls (measured with torch's MemTracker on a one-rank ring)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.testing._internal.distributed.fake_pg import FakeStore

from kiln.training.parallel.activation_checkpoint import _op_policy_context, save_ops
from kiln.training.parallel.ring_attention import ring_attention

S, H, D = 256, 2, 8


class _RingBlock(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        self.proj = nn.Linear(D, 3 * D, bias=False)
        self.fused = fused

    def forward(self, x):
        q, k, v = self.proj(x).transpose(1, 2).chunk(3, dim=-1)
        out = ring_attention(q, k, v, dist.group.WORLD, fused=self.fused)
        return out.transpose(1, 2)


def _live_bytes(tracker: MemTracker) -> int:
    snap = tracker.get_tracker_snapshot("current")
    return sum(v for per_device in snap.values() for k, v in per_device.items() if k != "Total")


@pytest.fixture
def one_rank():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "matmul"])
def test_ring_scores_are_not_saved(one_rank, fused):
    block = checkpoint_wrapper(_RingBlock(fused), context_fn=_op_policy_context)
    x = torch.randn(1, S, H, D, requires_grad=True)
    tracker = MemTracker()
    tracker.track_external(block)
    with tracker:
        before = _live_bytes(tracker)
        out = block(x)
        after = _live_bytes(tracker)
        out.sum().backward()
    kept = after - before
    # one rank, zig-zag: the diagonal block (S/2 x S/2) and the second chunk's (S/2 x S) scores
    scores = H * ((S // 2) * (S // 2) + (S // 2) * S) * 4
    # what must stay: the projection, q/k/v/out and the log-sum-exp (~130 KB), plus under the
    # fused kernel its per-block outputs (~18 KB); the fp32 path's scores are 393 KB more
    assert kept < scores / 2, (kept, scores)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_sdpa_kernels_are_saved():
    ops = save_ops()
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in ops
    assert torch.ops.aten._scaled_dot_product_efficient_attention.default in ops
