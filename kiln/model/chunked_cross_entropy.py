"""The output head and next-token cross entropy together, a chunk of tokens at a time.

The plain path materialises the logits [N, V] in the compute dtype, then an fp32 copy and
cross entropy's fp32 softmax: ~4.2 GB at 4 x 2048 tokens x 128k vocabulary. Here forward keeps
only each token's log-sum-exp (fp32 [N]); backward recomputes each chunk's logits and turns them
into that chunk's gradients at once, so at most one chunk of logits is alive. The maths is the
plain path's: logits in the compute dtype, softmax and loss in fp32, optional soft-capping,
labels of -100 ignored, mean over the remaining tokens. Costs one extra head GEMM per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from kiln.model.vocab_parallel_cross_entropy import vocab_parallel_linear_cross_entropy

IGNORE_INDEX = -100


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, softcap: float | None):
    """fp32 logits of one chunk and, with a soft cap, tanh(z / cap) for its derivative."""
    z = F.linear(h, weight).float()
    if softcap is None:
        return z, None
    t = torch.tanh(z / softcap)
    return t * softcap, t


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens, softcap):
        with torch.autocast(hidden.device.type, enabled=False):
            lse = torch.empty(hidden.shape[0], device=hidden.device, dtype=torch.float32)
            target = torch.zeros_like(lse)
            for start in range(0, hidden.shape[0], chunk_tokens):
                rows = slice(start, start + chunk_tokens)
                logits, _ = _chunk_logits(hidden[rows], weight, softcap)
                lse[rows] = torch.logsumexp(logits, dim=-1)
                y = labels[rows]
                kept = y != IGNORE_INDEX
                picked = logits.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)
                target[rows] = torch.where(kept, picked, 0.0)
            kept = labels != IGNORE_INDEX
            n_kept = kept.sum()
            loss = torch.where(kept, lse - target, 0.0).sum() / n_kept
        ctx.save_for_backward(hidden, weight, labels, lse, n_kept)
        ctx.chunk_tokens, ctx.softcap = chunk_tokens, softcap
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, labels, lse, n_kept = ctx.saved_tensors
        scale = grad_loss.float() / n_kept
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.chunk_tokens):
                rows = slice(start, start + ctx.chunk_tokens)
                h, y = hidden[rows], labels[rows]
                logits, t = _chunk_logits(h, weight, ctx.softcap)
                # d loss / d logits = (softmax - onehot(y)) / n_kept on kept rows, 0 elsewhere
                grad = torch.exp(logits - lse[rows].unsqueeze(1))
                grad.scatter_add_(1, y.clamp(min=0).unsqueeze(1), torch.full_like(grad[:, :1], -1))
                grad *= ((y != IGNORE_INDEX).float() * scale).unsqueeze(1)
                if t is not None:
                    grad *= 1 - t * t
                grad = grad.to(hidden.dtype)
                grad_hidden[rows] = grad @ weight
                grad_weight += (grad.t() @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


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
    master weights receive their gradients as they do through the plain nn.Linear head.
    """
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    if isinstance(weight, DTensor):  # tensor parallelism: the head is sharded by vocabulary
        return vocab_parallel_linear_cross_entropy(
            hidden, weight, labels, chunk_tokens, softcap, dtype
        )
    hidden = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    return _ChunkedLinearCrossEntropy.apply(
        hidden, weight.to(dtype), labels.reshape(-1), chunk_tokens, softcap
    )
