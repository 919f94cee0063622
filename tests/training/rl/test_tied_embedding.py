"""The trainer's forward gives a tied embedding lookup a sparse gradient (tied_embedding.py):
the parameter's gradient is still dense and equals the dense path's up to summation order; an
untied or frozen embedding keeps the dense path."""

from __future__ import annotations

import torch

from kiln.model.attention import set_attention_backend
from kiln.training.rl import tied_embedding
from kiln.training.rl.logprobs import completion_logprobs
from kiln.training.rl.tied_embedding import sparse_tied_embedding, ties_embedding
from tests.engine.tiny import tiny_model

VOCAB = 97


def _batch():
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (7, 11)]
    completions = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (4, 6, 3, 5)]
    # a token used by both the prompts and the completions: its row gets both gradients
    completions[0][0] = prompts[0][2]
    return [p for p in prompts for _ in range(2)], completions


def _grads(sparse: bool, monkeypatch) -> dict[str, torch.Tensor]:
    model = tiny_model("llama", VOCAB, tie_embeddings=True).train()
    set_attention_backend(model, "invariant")
    lookups = []
    model.tok_embeddings.register_forward_pre_hook(lambda m, args: lookups.append(m.sparse))
    with monkeypatch.context() as m:
        if not sparse:
            m.setattr(tied_embedding, "ties_embedding", lambda model: False)
        scores = completion_logprobs(model, *_batch(), 1.0)
    assert lookups == [sparse]  # the lookup ran sparse on that path only
    assert model.tok_embeddings.sparse is False  # restored after the forward
    weights = torch.linspace(-1, 1, scores.logp.numel()).view_as(scores.logp)
    (scores.logp * weights * scores.mask).sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_a_tied_embedding_gradient_is_dense_and_equals_the_dense_path(monkeypatch):
    sparse, dense = _grads(True, monkeypatch), _grads(False, monkeypatch)
    assert sparse.keys() == dense.keys()
    assert sparse["tok_embeddings.weight"].layout == torch.strided  # what AdamW takes
    for name, grad in sparse.items():
        full = dense[name]
        assert float((grad - full).abs().max()) <= 1e-6 * float(full.abs().max()), name


def test_untied_frozen_and_laid_out_embeddings_keep_the_dense_path():
    untied = tiny_model("llama", VOCAB, tie_embeddings=False)
    tied = tiny_model("llama", VOCAB, tie_embeddings=True)
    assert not ties_embedding(untied)
    assert ties_embedding(tied)
    tied.requires_grad_(False)
    assert not ties_embedding(tied)
    with sparse_tied_embedding(untied):
        assert untied.tok_embeddings.sparse is False
