"""The ring that ring attention runs on, shared by its matmul path (ring_attention.py) and its
fused-kernel path (ring_attention_fused.py): zig-zag sharding and global positions, which key
rows each query chunk may see (the block plan and its masks), the send-to-next /
receive-from-previous exchange, and the log-sum-exp merge of partial results."""

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
def ring_blocks():
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
class Chunk:
    start: int  # global position of the first token
    offset: int  # index of the first token in the rank-local sequence
    length: int


def local_chunks(local_len: int, rank: int, world: int, zigzag: bool) -> list[Chunk]:
    if not zigzag:
        return [Chunk(rank * local_len, 0, local_len)]
    c = local_len // 2
    return [Chunk(rank * c, 0, c), Chunk((2 * world - 1 - rank) * c, c, c)]


def local_positions(local_len: int, rank: int, world: int, zigzag: bool = True) -> torch.Tensor:
    """Global positions of a rank's local tokens."""
    return torch.cat(
        [
            torch.arange(c.start, c.start + c.length)
            for c in local_chunks(local_len, rank, world, zigzag)
        ]
    )


def visibility(q: Chunk, k: Chunk, causal: bool, window: int | None) -> str:
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
class Block:
    q: slice  # local query rows
    k: slice  # local rows of the key/value block
    mask: torch.Tensor | None  # [q rows, k rows] True = attend; None = all visible


def plan_blocks(q_chunks, k_chunks, causal, window, device) -> list[Block]:
    """Which query rows attend to which key rows of one key/value block, and with what mask
    (built on `device`: no host-side position tensors or copies per step)."""
    blocks = []
    for qc in q_chunks:
        seen = [(kc, v) for kc in k_chunks if (v := visibility(qc, kc, causal, window)) != "none"]
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
        blocks.append(Block(slice(qc.offset, qc.offset + qc.length), slice(lo, hi), mask))
    return blocks


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)


def merge_partial(out, lse, out_b, lse_b):
    """Combine two partial softmax results over disjoint key sets (log-sum-exp)."""
    new = torch.logaddexp(lse, lse_b)
    safe = finite_or_zero(new)
    out = out * torch.exp(lse - safe).unsqueeze(-1) + out_b * torch.exp(lse_b - safe).unsqueeze(-1)
    return out, new


class Ring:
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


def wait_all(works) -> None:
    for work in works:
        work.wait()


KV_TAG, DKV_TAG = 17, 18
