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

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

_state = threading.local()


def inside_ring_blocks() -> bool:
    """True while this thread computes ring-attention blocks (selective recompute's policy asks:
    the fp32 path's score matmuls are not worth saving)."""
    return getattr(_state, "depth", 0) > 0


@contextmanager
def _ring_blocks():
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def zigzag_shard(x: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s zig-zag part of x along dim: chunks rank and 2*world-1-rank of 2*world."""
    if x.shape[dim] % (2 * world):
        raise ValueError(f"length {x.shape[dim]} along dim {dim} must divide by 2*cp = {2 * world}")
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim)


@dataclass(frozen=True)
class _Chunk:
    start: int  # global position of the first token
    offset: int  # index of the first token in the rank-local sequence
    length: int


def _chunks(local_len: int, rank: int, world: int, zigzag: bool) -> list[_Chunk]:
    if not zigzag:
        return [_Chunk(rank * local_len, 0, local_len)]
    c = local_len // 2
    return [_Chunk(rank * c, 0, c), _Chunk((2 * world - 1 - rank) * c, c, c)]


def local_positions(local_len: int, rank: int, world: int, zigzag: bool = True) -> torch.Tensor:
    """Global positions of a rank's local tokens."""
    return torch.cat(
        [torch.arange(c.start, c.start + c.length) for c in _chunks(local_len, rank, world, zigzag)]
    )


def _visibility(q: _Chunk, k: _Chunk, causal: bool, window: int | None) -> str:
    """'all', 'none' or 'some' of the (query, key) pairs of two chunks may attend."""
    q_last, k_last = q.start + q.length - 1, k.start + k.length - 1
    full, empty = True, False
    if causal:
        full &= k_last <= q.start
        empty |= k.start > q_last
    if window is not None:  # key j visible from query i when i - j < window
        full &= q_last - k.start < window
        empty |= q.start - k_last >= window
    return "none" if empty else "all" if full else "some"


@dataclass
class _Block:
    q: slice  # local query rows
    k: slice  # local rows of the key/value block
    mask: torch.Tensor | None  # [q rows, k rows] True = attend; None = all visible


def _plan(q_chunks, k_chunks, causal, window, device) -> list[_Block]:
    """Which query rows attend to which key rows of one key/value block, and with what mask
    (built on `device`: no host-side position tensors or copies per step)."""
    blocks = []
    for qc in q_chunks:
        seen = [(kc, v) for kc in k_chunks if (v := _visibility(qc, kc, causal, window)) != "none"]
        if not seen:
            continue
        lo = min(kc.offset for kc, _ in seen)
        hi = max(kc.offset + kc.length for kc, _ in seen)
        mask = None
        if any(v == "some" for _, v in seen) or hi - lo != sum(kc.length for kc, _ in seen):
            qpos = torch.arange(qc.start, qc.start + qc.length, device=device)
            kpos = torch.cat(
                [torch.arange(kc.start, kc.start + kc.length, device=device) for kc in k_chunks]
            )[lo:hi]
            in_block = torch.zeros(hi - lo, dtype=torch.bool, device=device)
            for kc, _ in seen:
                in_block[kc.offset - lo : kc.offset - lo + kc.length] = True
            mask = in_block[None, :].expand(qc.length, -1).clone()
            if causal:
                mask &= kpos[None, :] <= qpos[:, None]
            if window is not None:
                mask &= (qpos[:, None] - kpos[None, :]) < window
        blocks.append(_Block(slice(qc.offset, qc.offset + qc.length), slice(lo, hi), mask))
    return blocks


def _scores(q, k, block: _Block, scale: float) -> torch.Tensor:
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


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)


def _attend_block(q, k, v, block: _Block, scale: float):
    """Partial attention of one block: (out [B, Hkv, G, Sq, D], lse [B, Hkv, G, Sq])."""
    s = _scores(q, k, block, scale)
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows with no visible key in this block
    p = torch.exp(s - _finite(lse).unsqueeze(-1))
    B, Hkv, G, Sq, Sk = p.shape
    out = torch.matmul(p.view(B, Hkv, G * Sq, Sk), v[:, :, block.k]).view(B, Hkv, G, Sq, -1)
    return out, lse


def _merge(out, lse, out_b, lse_b):
    """Combine two partial softmax results over disjoint key sets (log-sum-exp)."""
    new = torch.logaddexp(lse, lse_b)
    safe = _finite(new)
    out = out * torch.exp(lse - safe).unsqueeze(-1) + out_b * torch.exp(lse_b - safe).unsqueeze(-1)
    return out, new


class _Ring:
    """Neighbours in the group and one send-to-next / receive-from-previous exchange."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    def shift(self, send: torch.Tensor, tag: int):
        recv = torch.empty_like(send)
        ops = [
            dist.P2POp(dist.isend, send, self.next, self.group, tag),
            dist.P2POp(dist.irecv, recv, self.prev, self.group, tag),
        ]
        return recv, dist.batch_isend_irecv(ops)


def _wait(works) -> None:
    for work in works:
        work.wait()


_KV_TAG, _DKV_TAG = 17, 18


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, window, zigzag):
        ring = _Ring(group)
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
        q_chunks = _chunks(S, ring.rank, ring.world, zigzag)
        plans = []
        for step in range(ring.world):
            if step < ring.world - 1:
                next_kv, works = ring.shift(kv, _KV_TAG)  # overlaps with this step's compute
            src = (ring.rank - step) % ring.world
            plan = _plan(q_chunks, _chunks(S, src, ring.world, zigzag), causal, window, q.device)
            for block in plan:
                out_b, lse_b = _attend_block(qf, kv[0], kv[1], block, scale)
                rows = block.q
                out[:, :, :, rows], lse[:, :, :, rows] = _merge(
                    out[:, :, :, rows], lse[:, :, :, rows], out_b, lse_b
                )
            plans.append(plan)
            if step < ring.world - 1:
                _wait(works)
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
                next_kv, works = ring.shift(kv, _KV_TAG)
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
                dkv, dkv_works = ring.shift(dkv, _DKV_TAG)  # after the last step it is back home
                _wait(dkv_works)
            if step < ring.world - 1:
                _wait(works)
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
    from kiln.training.parallel.ring_attention_fused import (
        FusedRingAttention,
        fused_kernel_available,
    )

    if fused is None:
        fused = fused_kernel_available(q.device, q.dtype)
    impl = FusedRingAttention if fused else RingAttention
    with _ring_blocks():
        return impl.apply(q, k, v, group, causal, window, zigzag)
