"""The output head and next-token cross entropy together, a chunk of tokens at a time.

The plain path materialises the logits [N, V] in the compute dtype, then an fp32 copy and
cross entropy's fp32 softmax: ~4.2 GB at 4 x 2048 tokens x 128k vocabulary. Here forward keeps
only each token's log-sum-exp (fp32 [N]); backward recomputes each chunk's logits and turns them
into that chunk's gradients at once, so at most one chunk of logits is alive. The maths is the
plain path's: logits in the compute dtype, softmax and loss in fp32, optional soft-capping,
labels of -100 ignored, mean over the remaining tokens. Costs one extra head GEMM per chunk.

Under tensor parallelism the head is sharded by vocabulary (a `Shard(0)` DTensor): each rank
scores every token against its rows [start, start + V/tp), the softmax's max and sum and the
label's logit are all-reduced over the head's process group, and backward all-reduces each
chunk's hidden-state gradient, the one thing every rank's slice contributes to.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate

IGNORE_INDEX = -100


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, softcap: float | None):
    """fp32 logits of one chunk and, with a soft cap, tanh(z / cap) for its derivative."""
    z = F.linear(h, weight).float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


def _own_labels(labels: torch.Tensor, start: int, rows: int):
    """Each label's column in this rank's rows (clamped) and whether the label is one of them."""
    local = labels - start
    owned = (labels != IGNORE_INDEX) & (local >= 0) & (local < rows)
    return local.clamp(0, rows - 1), owned


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> None:
    if group is not None:
        dist.all_reduce(t, op, group=group)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens, softcap, group, start):
        with torch.autocast(hidden.device.type, enabled=False):
            lse = torch.empty(hidden.shape[0], device=hidden.device, dtype=torch.float32)
            target = torch.zeros_like(lse)
            for first in range(0, hidden.shape[0], chunk_tokens):
                rows = slice(first, first + chunk_tokens)
                logits, _ = _chunk_logits(hidden[rows], weight, softcap)
                peak = logits.max(dim=-1).values
                _all_reduce(peak, group, dist.ReduceOp.MAX)
                total = torch.exp(logits - peak.unsqueeze(1)).sum(dim=-1)
                _all_reduce(total, group)
                lse[rows] = peak + torch.log(total)
                column, owned = _own_labels(labels[rows], start, weight.shape[0])
                picked = logits.gather(1, column.unsqueeze(1)).squeeze(1)
                target[rows] = torch.where(owned, picked, 0.0)
            _all_reduce(target, group)
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
                logits, t = _chunk_logits(h, weight, ctx.softcap)
                # d loss / d logits = (softmax - onehot(y)) / n_kept on kept rows, 0 elsewhere
                grad = torch.exp(logits - lse[rows].unsqueeze(1))
                column, owned = _own_labels(y, ctx.start, weight.shape[0])
                grad.scatter_add_(1, column.unsqueeze(1), -owned.float().unsqueeze(1))
                grad *= ((y != IGNORE_INDEX).float() * scale).unsqueeze(1)
                if t is not None:
                    grad *= 1 - t * t
                grad = grad.to(hidden.dtype)
                partial = grad @ weight
                _all_reduce(partial, ctx.group)
                grad_hidden[rows] = partial
                grad_weight += (grad.t() @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk_tokens: int,
    softcap: float | None = None,
) -> torch.Tensor:
    """Mean token cross entropy of softcap(hidden @ weight^T) against labels, chunk by chunk.

    hidden [..., D], weight [V, D], labels [...] (-100: ignored). The GEMMs run in the compute
    dtype (autocast's when it is on, else hidden's); the casts stay autograd-tracked, so fp32
    master weights receive their gradients as they do through the plain nn.Linear head. A
    vocabulary-sharded DTensor weight (tensor parallelism) takes the all-reduced path; a
    sequence-sharded DTensor hidden is gathered first (every rank scores every token).
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    group, start = None, 0
    if isinstance(weight, DTensor):
        if isinstance(hidden, DTensor):
            hidden = hidden.redistribute(placements=[Replicate()]).to_local()
        mesh = weight.device_mesh
        vocab, size = weight.shape[0], mesh.size()
        start = mesh.get_local_rank() * ((vocab + size - 1) // size)  # Shard(0)'s ceil chunks
        group, weight = mesh.get_group(), weight.to_local()
    hidden = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    return _ChunkedLinearCrossEntropy.apply(
        hidden, weight.to(dtype), labels.reshape(-1), chunk_tokens, softcap, group, start
    )
