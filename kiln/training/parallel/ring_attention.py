"""Ring attention: exact attention over a sequence split across a context-parallel group.

Each rank holds its queries and passes its key/value block around the ring (P2P send/recv);
every rank attends its queries to every block it sees and merges the partial results with the
log-sum-exp trick (online softmax, fp32). The backward pass goes around the ring again and sends
each block's dK/dV accumulator along with it, so it ends up back at the block's owner.

Zig-zag sharding cuts the sequence into 2*cp chunks and gives rank r chunks r and 2*cp-1-r:
under a causal mask every rank then does the same amount of work. Masks (causal, sliding
window) are decided by global token positions, and whole chunk pairs that are fully visible or
fully masked skip the mask or the compute. GQA groups query heads over one key/value head
by reshaping, so key/value heads are never repeated in memory.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from kiln.training.parallel.ring import (
    DKV_TAG,
    KV_TAG,
    Block,
    Ring,
    finite_or_zero,
    local_chunks,
    merge_partial,
    plan_blocks,
    ring_blocks,
    wait_all,
)
from kiln.training.parallel.ring_attention_fused import FusedRingAttention, fused_kernel_available


def _scores(q, k, block: Block, scale: float) -> torch.Tensor:
    """q [B, Hkv, G, S, D], k [B, Hkv, Sk, D] -> masked scores [B, Hkv, G, Sq, Sk] of one block."""
    qb = q[:, :, :, block.q]
    B, Hkv, G, Sq, D = qb.shape
    kb = k[:, :, block.k]
    # Not in place: selective recompute hands back the saved matmul output when it replays this.
    s = torch.matmul(qb.reshape(B, Hkv, G * Sq, D), kb.transpose(-1, -2)) * scale
    s = s.view(B, Hkv, G, Sq, kb.shape[2])
    if block.mask is not None:
        s = s.masked_fill(~block.mask, float("-inf"))
    return s


def _attend_block(q, k, v, block: Block, scale: float):
    """Partial attention of one block: (out [B, Hkv, G, Sq, D], lse [B, Hkv, G, Sq])."""
    s = _scores(q, k, block, scale)
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows with no visible key in this block
    p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
    B, Hkv, G, Sq, Sk = p.shape
    out = torch.matmul(p.view(B, Hkv, G * Sq, Sk), v[:, :, block.k]).view(B, Hkv, G, Sq, -1)
    return out, lse


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, zigzag):
        ring = Ring(group)
        B, Hq, S, D = q.shape
        Hkv = k.shape[1]
        if Hq % Hkv:
            raise ValueError(f"query heads {Hq} must be a multiple of key/value heads {Hkv}")
        if zigzag and S % 2:
            raise ValueError(f"zig-zag ring attention needs an even local length, got {S}")
        scale = D**-0.5
        qf = q.float().reshape(B, Hkv, Hq // Hkv, S, D)
        kv = torch.stack([k, v]).float().contiguous()
        out = torch.zeros_like(qf)
        lse = torch.full(qf.shape[:-1], float("-inf"), device=q.device)
        q_chunks = local_chunks(S, ring.rank, ring.world, zigzag)
        plans = []
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, KV_TAG)  # overlaps with this step's compute
            src = (ring.rank - step) % ring.world
            plan = plan_blocks(
                q_chunks, local_chunks(S, src, ring.world, zigzag), causal, window, q.device
            )
            for block in plan:
                out_b, lse_b = _attend_block(qf, kv[0], kv[1], block, scale)
                rows = block.q
                out[:, :, :, rows], lse[:, :, :, rows] = merge_partial(
                    out[:, :, :, rows], lse[:, :, :, rows], out_b, lse_b
                )
            plans.append(plan)
            if step < ring.world - 1:
                wait_all(works)
                kv = next_kv
        ctx.ring, ctx.plans, ctx.scale = ring, plans, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out.reshape(B, Hq, S, D).to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        B, Hq, S, D = q.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        qf = q.float().reshape(B, Hkv, G, S, D)
        do = dout.float().reshape(B, Hkv, G, S, D)
        delta = (do * out).sum(-1)  # rowsum(dO * O): the softmax backward's correction term
        kv = torch.stack([k, v]).float().contiguous()
        dq = torch.zeros_like(qf)
        dkv = torch.zeros_like(kv)  # accumulator of the block currently held; travels with it
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, KV_TAG)
            for block in ctx.plans[step]:
                rows = block.q
                s = _scores(qf, kv[0], block, scale)
                p = torch.exp(s - lse[:, :, :, rows].unsqueeze(-1))  # masked entries: exp(-inf) = 0
                Sq, Sk = p.shape[-2:]
                p2 = p.reshape(B, Hkv, G * Sq, Sk)
                do2 = do[:, :, :, rows].reshape(B, Hkv, G * Sq, D)
                dkv[1][:, :, block.k] += torch.matmul(p2.transpose(-1, -2), do2)
                dp = torch.matmul(do2, kv[1][:, :, block.k].transpose(-1, -2))
                ds = p2 * (dp - delta[:, :, :, rows].reshape(B, Hkv, G * Sq, 1)) * scale
                dq[:, :, :, rows] += torch.matmul(ds, kv[0][:, :, block.k]).view(B, Hkv, G, Sq, D)
                q2 = qf[:, :, :, rows].reshape(B, Hkv, G * Sq, D)
                dkv[0][:, :, block.k] += torch.matmul(ds.transpose(-1, -2), q2)
            if ring.world > 1:
                dkv, dkv_works = ring.shift(dkv, DKV_TAG)  # after the last step it is back home
                wait_all(dkv_works)
            if step < ring.world - 1:
                wait_all(works)
                kv = next_kv
        dq = dq.reshape(B, Hq, S, D).to(q.dtype)
        return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    causal: bool = True,
    window: int | None = None,
    zigzag: bool = True,
    fused: bool | None = None,
) -> torch.Tensor:
    """Attention over a sequence sharded across `group`.

    q [B, Hq, S_local, D], k/v [B, Hkv, S_local, D] (Hkv divides Hq) -> [B, Hq, S_local, D].
    Rank r holds zig-zag chunks r and 2*cp-1-r of the sequence (or the r-th contiguous slice
    with zigzag=False). `window`: key j is visible from query i when i - j < window (Mistral).
    `fused`: run each block on a fused kernel that returns its log-sum-exp (default where every
    block has one: CPU's flash op; on CUDA flash for unmasked fp16/bf16 blocks on sm80+, else
    the memory-efficient op); False: the fp32 matmul path (any device).
    """
    if fused is None:
        fused = fused_kernel_available(q.device, q.dtype)
    impl = FusedRingAttention if fused else RingAttention
    with ring_blocks():
        return impl.apply(q, k, v, group, causal, window, zigzag)
