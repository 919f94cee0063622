"""Continuous batching: requests arriving at random moments, chunked prefill, per-row sampling and
per-request errors, against kiln's own generate run one request at a time."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from kiln.engine import Engine, EngineEvent, stream_events
from kiln.engine.sampler import SamplingParams
from kiln.platform.errors import InputError
from tests.engine.tiny import tiny_generator, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


class Collector:
    """Listener per request: its events, and an Event set when it ends."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self.done = threading.Event()

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)
        if event.kind != "token":
            self.done.set()

    @property
    def last(self) -> EngineEvent:
        assert self.done.wait(30), "request did not finish"
        return self.events[-1]


def random_requests(vocab: int, n: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        ([rng.randrange(vocab) for _ in range(rng.randint(1, 40))], rng.randint(1, 30))
        for _ in range(n)
    ]


def submit_at_random_moments(engine, requests, params_of, seed=0):
    rng = random.Random(seed)
    out = []
    for ids, max_tokens in requests:
        time.sleep(rng.choice([0.0, 0.0, 0.002, 0.01]))
        collector = Collector()
        engine.submit(ids, params_of(max_tokens), collector)
        out.append(collector)
    return out


@pytest.mark.parametrize("shape", ["llama", "mistral", "mixtral"])
def test_greedy_under_continuous_batching_equals_sequential_generate(shape, tokenizer):
    """... with 4-token KV blocks (rows spread over many blocks)."""
    gen = tiny_generator(shape, tokenizer, eos=False)
    requests = random_requests(tokenizer.get_vocab_size(), 24)

    def sequential():
        return [gen.generate_ids([ids], SamplingParams(max_new_tokens=m))[0] for ids, m in requests]

    # an end-of-text token that greedy decoding meets: some rows leave the batch early
    longest = max(sequential(), key=len)
    gen.eos_token_ids = {longest[len(longest) // 2]}
    expected = sequential()
    # 6 slots for 24 requests: they queue, join mid-flight and leave; 8-token prefill chunks
    engine = Engine(gen, max_slots=6, prefill_chunk=8, block_size=4).start()
    try:
        got = submit_at_random_moments(engine, requests, lambda m: SamplingParams(max_new_tokens=m))
        finals = [c.last for c in got]
    finally:
        engine.stop()
    assert [f.kind for f in finals] == ["finish"] * len(requests)
    assert [f.token_ids for f in finals] == expected
    assert any(f.finish_reason == "stop" for f in finals)  # some rows end at end-of-text
    assert engine.kv.num_free == engine.kv.pool.num_blocks  # every block back
    # fewer forwards than one request at a time would need: rows really shared steps
    assert engine.steps < sum(len(e) + 1 for e in expected)


def test_seeded_sampling_and_penalties_per_row_equal_generate(tokenizer):
    gen = tiny_generator("llama", tokenizer, eos=False)
    requests = random_requests(tokenizer.get_vocab_size(), 8, seed=1)
    params = [
        SamplingParams(max_new_tokens=m, temperature=0.9, top_k=40, top_p=0.9, seed=i)
        if i % 2
        else SamplingParams(max_new_tokens=m, repetition_penalty=1.3, frequency_penalty=0.5)
        for i, (_, m) in enumerate(requests)
    ]
    expected = [gen.generate_ids([ids], p)[0] for (ids, _), p in zip(requests, params, strict=True)]
    engine = Engine(gen, max_slots=3, prefill_chunk=16).start()
    try:
        got = [Collector() for _ in requests]
        for (ids, _), p, c in zip(requests, params, got, strict=True):
            engine.submit(ids, p, c)
        assert [c.last.token_ids for c in got] == expected
    finally:
        engine.stop()


def test_a_bad_request_fails_alone(tokenizer):
    gen = tiny_generator("llama", tokenizer)
    requests = random_requests(tokenizer.get_vocab_size(), 6, seed=2)
    expected = [gen.generate_ids([ids], SamplingParams(max_new_tokens=m))[0] for ids, m in requests]
    # bypasses validation: torch.topk(k=-3) raises while this row is sampled, beside the others
    bad = SamplingParams.model_construct(
        **{**SamplingParams().model_dump(), "temperature": 1.0, "top_k": -3, "max_new_tokens": 9}
    )
    engine = Engine(gen, max_slots=4, prefill_chunk=8).start()
    try:
        with pytest.raises(InputError, match="context"):
            engine.submit([1] * 96, SamplingParams(), Collector())
        good = [Collector() for _ in requests]
        broken, outside = Collector(), Collector()
        for i, ((ids, m), c) in enumerate(zip(requests, good, strict=True)):
            engine.submit(ids, SamplingParams(max_new_tokens=m), c)
            if i == 2:  # fails while sampled beside the others
                engine.submit(requests[0][0], bad, broken)
            if i == 3:  # its prefill fails: a token id outside the embeddings
                engine.submit([1, tokenizer.get_vocab_size() + 5], SamplingParams(), outside)
        assert broken.last.kind == "error" and outside.last.kind == "error"
        assert isinstance(outside.last.error, IndexError)
        assert [c.last.token_ids for c in good] == expected
        assert [c.last.kind for c in good] == ["finish"] * len(good)
    finally:
        engine.stop()
    assert engine.kv.num_free == engine.kv.pool.num_blocks


def test_streaming_through_asyncio_and_cancel_frees_the_blocks(tokenizer):
    gen = tiny_generator("llama", tokenizer, eos=False)
    ids = gen.encode("the quick brown fox")
    expected = gen.generate_ids([ids], SamplingParams(max_new_tokens=12))[0]
    engine = Engine(gen, max_slots=2, prefill_chunk=4).start()

    async def run():
        seen = [
            e.token_ids async for e in stream_events(engine, ids, SamplingParams(max_new_tokens=12))
        ]
        async for _ in stream_events(engine, ids, SamplingParams(max_new_tokens=50)):
            break  # the client goes away after its first token
        return seen

    try:
        seen = asyncio.run(run())
        assert seen[-1] == expected
        assert [len(s) for s in seen] == list(range(1, 13))  # one event per token
        deadline = time.time() + 5
        while engine.scheduler.running and time.time() < deadline:
            time.sleep(0.01)
        assert engine.kv.num_free == engine.kv.pool.num_blocks
    finally:
        engine.stop()


def test_a_lagging_stream_gets_the_tokens_it_missed_as_one_event(tokenizer):
    """With coalesce, tokens that arrived while the consumer was busy come as one event (the
    newest: each carries the completion so far), the finish event is never skipped, and the
    completion is the same."""
    gen = tiny_generator("llama", tokenizer, eos=False)
    ids = gen.encode("the quick brown fox")
    expected = gen.generate_ids([ids], SamplingParams(max_new_tokens=12))[0]
    engine = Engine(gen, max_slots=2, prefill_chunk=4).start()

    async def run():
        seen = []
        params = SamplingParams(max_new_tokens=12)
        async for event in stream_events(engine, ids, params, coalesce=True):
            seen.append(event)
            deadline = time.time() + 10
            while len(seen) == 1 and engine.scheduler.running and time.time() < deadline:
                time.sleep(0.01)  # the event loop is busy: the other tokens queue up
        return seen

    try:
        seen = asyncio.run(run())
    finally:
        engine.stop()
    lengths = [len(e.token_ids) for e in seen]
    assert seen[-1].kind == "finish" and seen[-1].token_ids == expected
    # the first event may already carry several tokens when the engine ran ahead of the loop
    assert lengths == sorted(set(lengths))
    assert len(seen) <= 3  # the first token(s), then the rest at once (and perhaps the finish)


@pytest.mark.parametrize(("chunk", "shape"), [(512, "llama"), (7, "llama"), (7, "mistral")])
def test_batched_and_chunked_prefill_equal_sequential_generate(chunk, shape, tokenizer):
    """Prompts queued before the engine starts are prefilled together: several per forward
    (right-padded, gathered slots), and with a small budget over several steps each (a gathered
    slot carries its cached prefix); the tokens equal one-at-a-time `generate`."""
    gen = tiny_generator(shape, tokenizer, eos=False)
    requests = random_requests(tokenizer.get_vocab_size(), 10, seed=3)
    expected = [gen.generate_ids([ids], SamplingParams(max_new_tokens=m))[0] for ids, m in requests]
    engine = Engine(gen, max_slots=5, prefill_chunk=chunk)
    got = [Collector() for _ in requests]
    for (ids, m), c in zip(requests, got, strict=True):
        engine.submit(ids, SamplingParams(max_new_tokens=m), c)
    engine.start()
    try:
        assert [c.last.token_ids for c in got] == expected
    finally:
        engine.stop()
    assert engine.prefill_chunks > engine.prefill_forwards  # forwards carried several prompts
    if chunk < 40:  # some prompt needed more than one step
        assert engine.prefill_chunks > len(requests)


def test_incremental_text_equals_full_decode(tokenizer):
    """Streaming decodes a few tokens per step; the text equals decoding the whole list, with
    multi-byte characters split across tokens held back until complete."""
    from kiln.engine.detokenize import IncrementalText

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    clean = tokenizer.encode("the quick brown fox: 狐 ü 🦊 jumps — over the lazy dog").ids
    streamed = IncrementalText(decode)
    for k in range(1, len(clean) + 1):
        got = streamed.update(clean[:k])
        assert got == decode(clean[:k]).rstrip("\ufffd")
    assert got == "the quick brown fox: 狐 ü 🦊 jumps — over the lazy dog"
    ids, rng = list(clean), random.Random(4)
    ids += [rng.randrange(tokenizer.get_vocab_size()) for _ in range(40)]
    text = IncrementalText(decode)
    for k in range(1, len(ids) + 1):
        got = text.update(ids[:k])
        full = decode(ids[:k])
        assert full.startswith(got)
        assert got == full or full[len(got) :].find("\ufffd") >= 0  # only a partial char waits
    assert "\ufffd" in decode(ids) or text.text == decode(ids)
