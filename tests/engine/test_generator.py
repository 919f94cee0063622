"""KV-cached, batched generation against the model's own forward (the no-cache reference)."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.generator import Generator, SamplingParams
from kiln.engine.sampler import filter_logits
from kiln.model.kv_cache import KVCache
from tests.engine.tiny import SHAPES, tiny_generator, train_tokenizer
from tests.engine.uncached import uncached_generate

# different lengths, so the batch is right-padded; longer than the Mistral window (5)
PROMPTS = [
    "the quick brown fox jumps over",
    "hello",
    "kiln turns raw text into a served language model",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cached_prefill_logits_equal_model_forward(shape, tokenizer):
    """A ragged batch through the cache, prefill then decode in chunks, at every position."""
    gen = tiny_generator(shape, tokenizer)
    ids = [gen.encode(p) for p in PROMPTS]
    width = max(map(len, ids))
    lengths = torch.tensor([len(s) for s in ids])
    tokens = torch.zeros(len(ids), width, dtype=torch.long)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = torch.tensor(seq)
    cache = KVCache.for_model(gen.model.cfg, len(ids), width + 8)
    with torch.no_grad():
        prefill = gen.model(tokens, kv_cache=cache)
        cache.truncate(lengths)
        # rows now stand at different lengths; two shared steps of 3 and 1 tokens follow
        extra = torch.randint(0, gen.model.cfg.vocab_size, (len(ids), 4))
        steps = [gen.model(extra[:, :3], kv_cache=cache), gen.model(extra[:, 3:], kv_cache=cache)]
        assert cache.lengths.tolist() == (lengths + 4).tolist()
        for row, seq in enumerate(ids):
            full = torch.cat([torch.tensor(seq), extra[row]])[None]
            reference = gen.model(full)[0]  # the uncached forward
            cached = torch.cat([prefill[row, : len(seq)], steps[0][row], steps[1][row]])
            torch.testing.assert_close(cached, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_with_cache_equals_without(shape, tokenizer):
    gen = tiny_generator(shape, tokenizer, eos=False)
    params = SamplingParams(max_new_tokens=24)
    cached = gen.generate(PROMPTS, params)
    uncached = uncached_generate(gen, PROMPTS, params)
    for c, u in zip(cached, uncached, strict=False):
        assert c.completion_tokens == 24 and c.finish_reason == "length"
        assert c.token_ids == u.token_ids
        assert c.text == u.text
    # alone or in a batch: the same tokens
    assert gen.generate([PROMPTS[1]], params)[0].token_ids == cached[1].token_ids


def test_generation_runs_past_the_sliding_window_and_to_the_context_limit(tokenizer):
    gen = tiny_generator("mistral", tokenizer, eos=False, max_seq_len=40)
    prompt_len = len(gen.encode(PROMPTS[2]))
    params = SamplingParams(max_new_tokens=100)
    cached, uncached = (
        gen.generate([PROMPTS[2]], params)[0],
        uncached_generate(gen, [PROMPTS[2]], params)[0],
    )
    assert cached.finish_reason == "length"
    assert prompt_len + cached.completion_tokens == 40  # prompt + completion fill the context
    assert cached.token_ids == uncached.token_ids


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(tokenizer):
    gen = tiny_generator("llama", tokenizer, eos=False)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    batch = gen.generate(PROMPTS, params)
    alone = gen.generate([PROMPTS[2]], params)[0]
    assert alone.token_ids == batch[2].token_ids
    assert uncached_generate(gen, PROMPTS, params)[0].token_ids == batch[0].token_ids
    other = gen.generate([PROMPTS[2]], params.model_copy(update={"seed": 8}))[0]
    assert other.token_ids != alone.token_ids
    # per-prompt parameters in one batch
    mixed = gen.generate(PROMPTS[:2], [params, SamplingParams(max_new_tokens=5)])
    assert mixed[0].token_ids == batch[0].token_ids
    assert (
        mixed[1].token_ids
        == gen.generate([PROMPTS[1]], SamplingParams(max_new_tokens=5))[0].token_ids
    )
    # top_k=1 sampling is greedy
    top1 = gen.generate(
        [PROMPTS[0]], SamplingParams(max_new_tokens=8, temperature=2.0, top_k=1, seed=1)
    )[0]
    assert (
        top1.token_ids == gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8))[0].token_ids
    )


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isfinite(filter_logits(logits, 2, 1.0)).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, 0, 0.7)).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, 0, 0.5)).tolist() == [True, False, False, False]
    assert torch.isfinite(filter_logits(logits, 0, 1.0)).all()


def test_stop_strings_and_eos(tokenizer):
    gen = tiny_generator("llama", tokenizer, eos=False)
    full = gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=20))[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    assert stop and stop in full.text
    cut = gen.generate([PROMPTS[0]], SamplingParams(max_new_tokens=20, stop=["never-there", stop]))[
        0
    ]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.completion_tokens < full.completion_tokens
    # an end-of-text token stops a sequence (and is not part of the completion)
    eos_id = full.token_ids[3]
    with_eos = Generator(gen.model, tokenizer, eos_token_ids=[eos_id])
    stopped = with_eos.generate([PROMPTS[0]], SamplingParams(max_new_tokens=20))[0]
    assert (
        stopped.finish_reason == "stop"
        and stopped.token_ids == full.token_ids[: full.token_ids.index(eos_id)]
    )


def test_stream_deltas_join_to_the_completion(tokenizer):
    gen = tiny_generator("mixtral", tokenizer, eos=False)
    for params in (
        SamplingParams(max_new_tokens=12),
        SamplingParams(max_new_tokens=12, temperature=0.8, seed=3),
    ):
        deltas = list(gen.stream(PROMPTS[1], params))
        assert len(deltas) > 1
        assert "".join(deltas) == gen.generate([PROMPTS[1]], params)[0].text
    full = gen.generate([PROMPTS[1]], SamplingParams(max_new_tokens=12))[0].text
    stop = full[4:6]
    streamed = "".join(gen.stream(PROMPTS[1], SamplingParams(max_new_tokens=12, stop=[stop])))
    assert streamed == full[: full.index(stop)]


def test_limits(tokenizer):
    from kiln.platform.errors import InputError

    gen = tiny_generator("llama", tokenizer, max_seq_len=8)
    assert gen.generate(["hello"], SamplingParams(max_new_tokens=0))[0].completion_tokens == 0
    with pytest.raises(InputError, match="context"):
        gen.generate([PROMPTS[2]], SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
