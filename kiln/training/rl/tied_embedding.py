"""A tied embedding's gradient without a second vocabulary-sized tensor.

With the embedding and the LM head one weight (SmolLM2, Gemma), a backward computes two
gradients of the [V, D] table: the head's (dense, every row) and the embedding lookup's, which
`nn.Embedding` writes into a fresh zero-filled [V, D] table for the few rows a batch used; autograd
then adds the two into a third. The trainer's batches touch a few hundred of tens of thousands of
rows, so on CPU those two fills and the sum cost more than the lookup itself (~6% of SmolLM2's
GRPO update). With the lookup's gradient sparse (`sparse=True`, PyTorch's own option) autograd
adds its rows into the head's dense gradient in place: the parameter's gradient is dense as
before (the fused AdamW takes it) and equal up to the summation order of a row used twice.

Only a tied weight qualifies: an untied embedding's gradient would stay sparse, which the
optimizer cannot take. A weight laid out over ranks (DTensor) keeps the dense path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.distributed.tensor import DTensor


def ties_embedding(model: nn.Module) -> bool:
    """Whether `model`'s embedding is its trainable LM head's weight, as a plain tensor."""
    embedding = getattr(model, "tok_embeddings", None)
    output = getattr(model, "output", None)
    if not isinstance(embedding, nn.Embedding) or output is None:
        return False
    weight = embedding.weight
    return output.weight is weight and weight.requires_grad and not isinstance(weight, DTensor)


@contextmanager
def sparse_tied_embedding(model: nn.Module) -> Iterator[None]:
    """Forwards run inside give a tied embedding lookup a sparse gradient (see above)."""
    if not ties_embedding(model):
        yield
        return
    embedding = model.tok_embeddings
    before, embedding.sparse = embedding.sparse, True
    try:
        yield
    finally:
        embedding.sparse = before
