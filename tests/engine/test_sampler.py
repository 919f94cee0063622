"""The batched sampler (`sample_next`: every sampled row's distribution formed at once, one
uniform number drawn per row) against a per-row reference: the same distributions bit for bit,
the same tokens and generator states, so a seeded request's stream does not depend on its batch;
and the draws follow the distribution."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.sampler import (
    TEMPERATURE_MIN,
    SamplingParams,
    apply_penalties,
    draw_rows,
    make_generator,
    sample_next,
    sample_tokens,
    sampling_probs,
)


def _reference_filter(logits, top_k, top_p):
    if top_k and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _reference_probs(logits, params):
    logits = torch.nan_to_num(logits.double(), nan=float("-inf"))
    if params.greedy or not torch.isfinite(logits).any():
        return None
    finite_max = logits.masked_fill(~torch.isfinite(logits), float("-inf")).max()
    row = (logits - finite_max).clamp(min=-1e300) / max(params.temperature, TEMPERATURE_MIN)
    probs = torch.softmax(_reference_filter(row, params.top_k, params.top_p), dim=-1)
    if not torch.isfinite(probs).all() or float(probs.sum()) <= 0:
        return None
    return probs


def _reference_draw(probs, generator):
    """Inverse CDF on one row: the first token whose cumulative mass exceeds u x total."""
    u = float(torch.rand(1, dtype=torch.float64, generator=generator)[0])
    cdf = probs.cumsum(-1)
    x = u * float(cdf[-1])
    for i in range(len(cdf)):
        if float(cdf[i]) > x:
            return i
    return int(torch.nonzero(probs).max())


def _reference_next(logits, params, generators, histories):
    """`sample_next` row by row (the loop it was before it batched the rows)."""
    logits = logits.float()
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        row = logits[i]
        if p.penalized:
            row = apply_penalties(row, p, *histories[i])
        elif p.greedy:
            continue
        probs = _reference_probs(row, p)
        if probs is None:
            out[i] = int(torch.nan_to_num(row.double(), nan=float("-inf")).argmax())
        else:
            out[i] = _reference_draw(probs, generators[i])
    return out


def _params(vocab: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, top_p=0.9, seed=2),
        SamplingParams(),  # greedy
        SamplingParams(temperature=1.3, top_k=5, seed=3),
        SamplingParams(temperature=0.5, top_k=vocab // 2, top_p=0.5, seed=4),
        SamplingParams(temperature=1.0, repetition_penalty=1.3, seed=5),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.2),  # greedy, penalized
        SamplingParams(temperature=2.0, top_k=1, seed=6),
        SamplingParams(temperature=1e-6, top_p=1e-9, seed=7),
        SamplingParams(temperature=1.0, top_k=vocab + 3, seed=8),
        SamplingParams(temperature=0.9, top_p=0.95),  # unseeded: compared by state only
    ]


@pytest.mark.parametrize("vocab", [7, 300])
def test_batched_sampling_equals_the_per_row_sampler(vocab):
    torch.manual_seed(0)
    params = _params(vocab)
    rows = len(params) + 3
    params += [
        SamplingParams(temperature=1.0, seed=9),
        SamplingParams(temperature=1.0, top_p=0.8, seed=10),
        SamplingParams(temperature=0.8, seed=11),
    ]
    histories = [([1, 2, 3], [4, 4, 5]) for _ in range(rows)]
    ours = [make_generator(p, "cpu") for p in params]
    theirs = [make_generator(p, "cpu") for p in params]
    for g, h in zip(ours, theirs, strict=True):
        if g is not None:
            h.set_state(g.get_state())  # the unseeded row's random seed too
    for step in range(40):
        logits = torch.randn(rows, vocab) * (1 + step % 4)
        logits[:, step % vocab] = logits[:, (step + 1) % vocab]  # ties for sort and top-k
        if step % 5 == 0:  # rows that cannot be sampled: they take their argmax
            logits[-3] = float("nan")
            logits[-2, 0] = float("inf")
            logits[-1] = float("-inf")
        got = sample_next(logits, params, ours, histories)
        want = _reference_next(logits, params, theirs, histories)
        assert got.tolist() == want.tolist(), step
    for g, h in zip(ours, theirs, strict=True):
        if g is not None:
            assert torch.equal(g.get_state(), h.get_state())


def test_one_rows_distribution_is_the_reference_bit_for_bit():
    torch.manual_seed(1)
    logits = torch.randn(1000) * 3
    for p in _params(1000)[:5] + [SamplingParams(temperature=0.3, top_k=40, top_p=0.7)]:
        want = _reference_probs(logits, p)
        got = sampling_probs(logits, p)
        assert (got is None) == (want is None)
        if want is not None:
            assert torch.equal(got, want)


def test_draws_follow_the_distribution_and_skip_zero_mass():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.15, 0.05, 0.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(
        torch.tensor(draw_rows(probs.expand(n, -1), [gen] * n)), minlength=6
    ).double()
    assert counts[1] == 0 and counts[5] == 0
    # each frequency within 4 standard deviations of its probability
    sd = (probs[0] * (1 - probs[0]) / n).sqrt()
    assert ((counts / n - probs[0]).abs() <= 4 * sd + 1e-12).all(), counts / n


def test_a_seeded_row_draws_the_same_tokens_alone_and_in_a_batch():
    torch.manual_seed(2)
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=s) for s in range(6)]
    batch = [make_generator(p, "cpu") for p in params]
    alone = make_generator(params[3], "cpu")
    for _ in range(20):
        logits = torch.randn(6, 50)
        together = sample_next(logits, params, batch)
        by_itself = sample_next(logits[3:4], params[3:4], [alone])
        assert together[3] == by_itself[0]


def test_a_batch_of_only_sampled_rows_equals_the_per_row_sampler():
    # every row drawn (an RL rollout's batch): no argmax and no row selection, the same tokens,
    # and the caller's logits left as they were
    torch.manual_seed(4)
    params = [SamplingParams(temperature=t, seed=s) for s, t in enumerate((1.0, 0.7, 1.3, 1.0))]
    ours = [make_generator(p, "cpu") for p in params]
    theirs = [make_generator(p, "cpu") for p in params]
    for step in range(20):
        logits = torch.randn(4, 50)
        if step % 4 == 0:  # a row that cannot be sampled takes its argmax
            logits[2] = float("nan")
        before = logits.clone()
        got = sample_tokens(logits, params, ours)
        assert got == _reference_next(logits, params, theirs, None).tolist(), step
        torch.testing.assert_close(logits, before, rtol=0, atol=0, equal_nan=True)
