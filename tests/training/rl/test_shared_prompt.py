"""The trainer's forward with each prompt computed once for its group (shared_prompt.py)
against the full forward over every prompt + completion: the same logits bit for bit under the
batch-invariant attention (so the engine's log-probs still equal the trainer's exactly), the
same gradients up to summation order, for sliding-window and MoE models too."""

from __future__ import annotations

import pytest
import torch

from kiln.model.attention import set_attention_backend
from kiln.training.rl import shared_prompt
from kiln.training.rl.logprobs import completion_logits, completion_logprobs
from tests.engine.tiny import tiny_model

VOCAB = 97


def _batch():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (9, 4, 13)]
    lengths = [5, 1, 7, 3, 6, 6, 2, 8, 1]  # three completions a prompt, one token long too
    completions = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return [p for p in prompts for _ in range(3)], completions


def _full(model, prompts, completions, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(shared_prompt, "applies", lambda *a: False)
        return completion_logits(model, prompts, completions)


@pytest.mark.parametrize("shape", ["llama", "mistral", "mixtral"])
def test_shared_prompt_logits_equal_the_full_forward(shape, monkeypatch):
    model = tiny_model(shape, VOCAB)
    set_attention_backend(model, "invariant")
    prompts, completions = _batch()
    assert shared_prompt.applies(model, prompts)
    full = _full(model, prompts, completions, monkeypatch)
    shared = completion_logits(model, prompts, completions)
    assert torch.equal(shared.targets, full.targets)
    assert all(torch.equal(a, b) for a, b in zip(shared.place, full.place, strict=True))
    assert torch.equal(shared.logits, full.logits)


@pytest.mark.parametrize("backend", ["invariant", "sdpa"])
def test_shared_prompt_gradients_equal_the_full_forward(backend, monkeypatch):
    prompts, completions = _batch()
    grads = []
    for shared in (True, False):
        model = tiny_model("mistral", VOCAB).train()
        set_attention_backend(model, backend)
        with monkeypatch.context() as m:
            if not shared:
                m.setattr(shared_prompt, "applies", lambda *a: False)
            scores = completion_logprobs(model, prompts, completions, 0.8)
        weights = torch.linspace(-1, 1, scores.logp.numel()).view_as(scores.logp)
        (scores.logp * weights * scores.mask).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():  # fp32 summation order: ~3e-7 of the largest entry
        full = grads[1][name]
        assert float((grad - full).abs().max()) <= 1e-5 * float(full.abs().max()), name
    assert grads[0]["tok_embeddings.weight"].abs().sum() > 0


def test_distinct_prompts_and_mla_take_the_full_forward():
    model = tiny_model("llama", VOCAB)
    assert not shared_prompt.applies(model, [[1, 2], [1, 3]])
    assert shared_prompt.applies(model, [[1, 2], [1, 2]])
    capped = tiny_model("mixtral", VOCAB, capacity_factor=1.0)
    assert not shared_prompt.applies(capped, [[1, 2], [1, 2]])


@pytest.mark.parametrize("lengths", [[1, 1, 1, 1], [0, 3, 1, 0]])
def test_one_token_and_empty_completions_equal_the_full_forward(lengths, monkeypatch):
    """Nothing of the completions in the packed row (each is one token or none), or some
    empty: the prompts' last positions alone give the logits."""
    model = tiny_model("llama", VOCAB)
    set_attention_backend(model, "invariant")
    prompts = [_batch()[0][i] for i in (0, 0, 3, 3)]  # 9 and 4 tokens
    completions = [list(range(10, 10 + n)) for n in lengths]
    full = _full(model, prompts, completions, monkeypatch)
    shared = completion_logits(model, prompts, completions)
    assert shared.logits.shape[0] == sum(lengths)
    assert torch.equal(shared.logits, full.logits)
