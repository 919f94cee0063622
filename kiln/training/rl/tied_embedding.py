"""A tied embedding's gradient without a second vocabulary-sized tensor.

With the embedding and the LM head one weight (SmolLM2, Gemma), a backward computes two
gradients of the [V, D] table: the head's (dense, every row) and the embedding lookup's, which
`nn.Embedding` writes into a fresh zero-filled [V, D] table for the few rows a batch used; autograd
then adds the two into a third. The trainer's batches touch a few hundred of tens of thousands of
rows, so on CPU those fills and the sum cost more than the lookup itself. A sparse lookup
gradient (`sparse=True`) saves the fill but not the sum: autograd adds a dense and a sparse
gradient out of place, one copy of the table per backward (~0.1 s for SmolLM2's 49152 x 576).

Here the lookup reads a detached weight, so autograd sees one gradient of the parameter, the
head's, and stores it as `.grad` without a copy; a hook on the looked-up rows adds their
gradients into that `.grad` in place (`index_add_`). The backward runs the head's gradient into
`.grad` long before it reaches the embedding; were the order ever the other way the hook starts
`.grad` from zeros and autograd adds the head's in place: the sum is the same either way, equal
to the dense path's up to the summation order of a row used twice.

Only a tied, trainable, plain weight qualifies (an untied embedding's gradient has no dense
gradient to land in; a weight laid out over ranks, DTensor, keeps the dense path, as does a
lookup with `padding_idx`, `max_norm` or `scale_grad_by_freq`, which shape its gradient). The
gradient reaches `.grad` outside autograd's graph: `torch.autograd.grad` would miss the rows, so
only forwards whose loss calls `.backward()` run inside `tied_embedding_in_place`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


def ties_embedding(model: nn.Module) -> bool:
    """Whether `model`'s embedding is its trainable LM head's weight, as a plain tensor, looked
    up without options that change its gradient."""
    embedding = getattr(model, "tok_embeddings", None)
    output = getattr(model, "output", None)
    if not isinstance(embedding, nn.Embedding) or output is None:
        return False
    weight = embedding.weight
    plain_lookup = (
        embedding.padding_idx is None
        and embedding.max_norm is None
        and not embedding.scale_grad_by_freq
    )
    return (
        output.weight is weight
        and weight.requires_grad
        and not isinstance(weight, DTensor)
        and plain_lookup
    )


def _lookup_into_grad(weight: nn.Parameter):
    """An embedding forward whose rows' gradients are added into `weight.grad` in place."""

    def forward(ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, weight.detach())
        if not torch.is_grad_enabled():
            return rows
        rows.requires_grad_()

        def add_rows(grad: torch.Tensor) -> None:
            if weight.grad is None:  # the head's gradient not stored yet: autograd adds it
                weight.grad = torch.zeros_like(weight)
            weight.grad.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]))

        rows.register_hook(add_rows)
        return rows

    return forward


@contextmanager
def tied_embedding_in_place(model: nn.Module) -> Iterator[None]:
    """Forwards run inside add a tied embedding lookup's gradient into the head's (see above)."""
    if not ties_embedding(model):
        yield
        return
    embedding = model.tok_embeddings
    embedding.forward = _lookup_into_grad(embedding.weight)  # this instance only
    try:
        yield
    finally:
        del embedding.forward  # back to nn.Embedding.forward
