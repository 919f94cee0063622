"""The trainer's forward adds a tied embedding lookup's gradient into the head's in place
(tied_embedding.py): the parameter's gradient is dense, equals the dense path's up to summation
order, and is the very tensor the head's gradient was stored in (no copy of the table); an
untied or frozen embedding keeps the dense path."""

from __future__ import annotations

import torch

from kiln.model.attention import set_attention_backend
from kiln.training.rl import tied_embedding
from kiln.training.rl.logprobs import completion_logprobs
from kiln.training.rl.tied_embedding import tied_embedding_in_place, ties_embedding
from tests.engine.tiny import tiny_model

VOCAB = 97


def _batch():
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (7, 11)]
    completions = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (4, 6, 3, 5)]
    # a token used by both the prompts and the completions: its row gets both gradients
    completions[0][0] = prompts[0][2]
    return [p for p in prompts for _ in range(2)], completions


def _in_place(module) -> bool:
    return "forward" in vars(module)  # the lookup's instance forward (tied_embedding.py)


def _grads(in_place: bool, monkeypatch) -> dict[str, torch.Tensor]:
    model = tiny_model("llama", VOCAB, tie_embeddings=True).train()
    set_attention_backend(model, "invariant")
    lookups, arriving = [], []
    model.tok_embeddings.register_forward_pre_hook(lambda m, args: lookups.append(_in_place(m)))
    # the parameter's gradient as autograd hands it over to be stored in `.grad`
    model.output.weight.register_hook(lambda g: arriving.append((g.data_ptr(), g.clone())))
    with monkeypatch.context() as m:
        if not in_place:
            m.setattr(tied_embedding, "ties_embedding", lambda model: False)
        scores = completion_logprobs(model, *_batch(), 1.0)
    assert lookups == [in_place]  # the in-place lookup ran on that path only
    assert not _in_place(model.tok_embeddings)  # nn.Embedding's forward after the forward
    weights = torch.linspace(-1, 1, scores.logp.numel()).view_as(scores.logp)
    (scores.logp * weights * scores.mask).sum().backward()
    (pointer, value), grad = arriving[0], model.output.weight.grad
    assert len(arriving) == 1 and pointer == grad.data_ptr()  # stored as handed over: no copy
    # in place, autograd hands over the head's gradient alone and the rows join it afterwards
    assert torch.equal(value, grad) is not in_place
    return {n: p.grad for n, p in model.named_parameters()}


def test_a_tied_embedding_gradient_is_dense_and_equals_the_dense_path(monkeypatch):
    in_place, dense = _grads(True, monkeypatch), _grads(False, monkeypatch)
    assert in_place.keys() == dense.keys()
    assert in_place["tok_embeddings.weight"].layout == torch.strided  # what AdamW takes
    for name, grad in in_place.items():
        full = dense[name]
        assert float((grad - full).abs().max()) <= 1e-6 * float(full.abs().max()), name


def test_untied_frozen_and_laid_out_embeddings_keep_the_dense_path():
    untied = tiny_model("llama", VOCAB, tie_embeddings=False)
    tied = tiny_model("llama", VOCAB, tie_embeddings=True)
    assert not ties_embedding(untied)
    assert ties_embedding(tied)
    tied.requires_grad_(False)
    assert not ties_embedding(tied)
    with tied_embedding_in_place(untied):
        assert not _in_place(untied.tok_embeddings)


def test_the_rows_land_in_grad_whichever_gradient_comes_first():
    """Without the head's gradient stored first (here: none at all) the hook starts from zeros,
    and a second backward accumulates onto the first, as autograd does."""
    model = tiny_model("llama", VOCAB, tie_embeddings=True)
    weight = model.tok_embeddings.weight
    ids = torch.tensor([[3, 5, 3]])
    with tied_embedding_in_place(model):
        rows = model.tok_embeddings(ids)
    rows.sum().backward()
    expected = torch.zeros_like(weight)
    expected[3], expected[5] = 2.0, 1.0
    torch.testing.assert_close(weight.grad, expected, rtol=0, atol=0)
    with tied_embedding_in_place(model):
        (model.tok_embeddings(ids) * 2).sum().backward()
    torch.testing.assert_close(weight.grad, 3 * expected, rtol=0, atol=0)
