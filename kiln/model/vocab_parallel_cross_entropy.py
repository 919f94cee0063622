"""Chunked linear + cross entropy when the head is vocabulary-sharded (tensor parallelism).

Each rank holds rows [start, start + V/tp) of the head. Per chunk of tokens it computes its own
logits, and the softmax's max, sum and the label's logit are all-reduced over the head's process
group; backward all-reduces each chunk's hidden-state gradient, the one thing every rank's
vocabulary slice contributes to. As on one rank, at most one chunk of (local) logits is alive.
The maths equals `chunked_cross_entropy` on the gathered head.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate

IGNORE_INDEX = -100


def _local_logits(h, weight, softcap):
    z = F.linear(h, weight).float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


def _owned(labels, start, rows):
    """This rank's column of each label (clamped) and whether the label is in its slice."""
    local = labels - start
    owned = (labels != IGNORE_INDEX) & (local >= 0) & (local < rows)
    return local.clamp(0, rows - 1), owned


class _VocabParallelChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens, softcap, group, start):
        with torch.autocast(hidden.device.type, enabled=False):
            lse = torch.empty(hidden.shape[0], device=hidden.device, dtype=torch.float32)
            target = torch.zeros_like(lse)
            for first in range(0, hidden.shape[0], chunk_tokens):
                rows = slice(first, first + chunk_tokens)
                z, _ = _local_logits(hidden[rows], weight, softcap)
                peak = z.max(dim=-1).values
                dist.all_reduce(peak, dist.ReduceOp.MAX, group=group)
                total = torch.exp(z - peak.unsqueeze(1)).sum(dim=-1)
                dist.all_reduce(total, group=group)
                lse[rows] = peak + torch.log(total)
                column, owned = _owned(labels[rows], start, weight.shape[0])
                picked = z.gather(1, column.unsqueeze(1)).squeeze(1)
                target[rows] = torch.where(owned, picked, 0.0)
            dist.all_reduce(target, group=group)
            kept = labels != IGNORE_INDEX
            n_kept = kept.sum()
            loss = torch.where(kept, lse - target, 0.0).sum() / n_kept
        ctx.save_for_backward(hidden, weight, labels, lse, n_kept)
        ctx.chunk_tokens, ctx.softcap, ctx.group, ctx.start = chunk_tokens, softcap, group, start
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, labels, lse, n_kept = ctx.saved_tensors
        scale = grad_loss.float() / n_kept
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            for first in range(0, hidden.shape[0], ctx.chunk_tokens):
                rows = slice(first, first + ctx.chunk_tokens)
                h, y = hidden[rows], labels[rows]
                z, t = _local_logits(h, weight, ctx.softcap)
                grad = torch.exp(z - lse[rows].unsqueeze(1))  # this slice of the softmax
                column, owned = _owned(y, ctx.start, weight.shape[0])
                grad.scatter_add_(1, column.unsqueeze(1), -owned.float().unsqueeze(1))
                grad *= ((y != IGNORE_INDEX).float() * scale).unsqueeze(1)
                if t is not None:
                    grad *= 1 - t * t
                grad = grad.to(hidden.dtype)
                partial = grad @ weight
                dist.all_reduce(partial, group=ctx.group)
                grad_hidden[rows] = partial
                grad_weight += (grad.t() @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def vocab_parallel_linear_cross_entropy(
    hidden: DTensor | torch.Tensor,
    weight: DTensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    softcap: float | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """`linear_cross_entropy` for a head sharded by rows over a 1-D mesh (`Shard(0)`); hidden may
    be sequence-sharded (it is gathered: every rank scores every token against its slice)."""
    if isinstance(hidden, DTensor):
        hidden = hidden.redistribute(placements=[Replicate()]).to_local()
    mesh = weight.device_mesh
    rank, size = mesh.get_local_rank(), mesh.size()
    vocab = weight.shape[0]
    start = rank * ((vocab + size - 1) // size)  # torch's Shard(0): ceil-sized leading chunks
    hidden = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    return _VocabParallelChunkedCE.apply(
        hidden,
        weight.to_local().to(dtype),
        labels.reshape(-1),
        chunk_tokens,
        softcap,
        mesh.get_group(),
        start,
    )
