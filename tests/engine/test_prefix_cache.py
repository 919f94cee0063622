"""Automatic prefix caching and preemption in the engine: the same greedy tokens with the cache on
and off (shared system prompts, multi-turn chats, n=4 siblings), the hit rate of a shared-prefix
workload, no block leaked over 1,000 requests with cancellations, and every request answered
correctly under a block budget too small for the batch (preemption by recompute)."""

from __future__ import annotations

import random

import pytest

from kiln.engine import Engine
from kiln.engine.block_pool import BlockPool
from kiln.engine.prefix_hash import extend_hashes, hash_block
from kiln.engine.sampler import SamplingParams
from tests.engine.tiny import tiny_generator, train_tokenizer


@pytest.fixture(scope="module")
def gen():
    # a 256-token context, no end-of-text: every completion runs to its max_new_tokens
    return tiny_generator("llama", train_tokenizer(), eos=False, max_seq_len=256)


def run_all(engine: Engine, jobs, salts=None):
    """Submit every (prompt ids, params) job at once and step until all finish."""
    requests = [
        engine.submit(ids, p, lambda e: None, cache_salt=salts[i] if salts else None)
        for i, (ids, p) in enumerate(jobs)
    ]
    for _ in engine.run(requests):
        pass
    for r in requests:
        assert r.error is None, r.error
    return [r.seq.token_ids for r in requests]


def all_blocks_free(engine: Engine) -> bool:
    pool = engine.kv.pool
    return pool.num_free == pool.num_blocks and all(b.ref_cnt == 0 for b in pool.blocks)


def test_chained_hashes_and_lru_eviction_of_unreferenced_blocks():
    a = extend_hashes([], list(range(10)), 4)
    assert len(a) == 2  # full blocks only
    assert a[1] == hash_block(a[0], [4, 5, 6, 7])
    assert extend_hashes([], [9, 1, 2, 3, 4, 5, 6, 7], 4)[1] != a[1]  # the parent differs
    assert extend_hashes([], list(range(8)), 4, extra="adapter-a")[1] != a[1]
    pool = BlockPool(5)  # blocks 1..4
    x, y = pool.take(2)
    pool.cache(x, b"x")
    pool.cache(y, b"y")
    pool.release([y, x])  # y joins the queue first: evicted first
    assert pool.num_free == 4 and pool.cached(b"x") is x
    pool.touch([x])  # a hit revives x: out of the free queue
    assert pool.num_free == 3
    taken = pool.take(3)  # the 2 never-used blocks, then y (least recently freed)
    assert y in taken and pool.cached(b"y") is None and y.hash is None
    assert pool.cached(b"x") is x and x not in taken
    with pytest.raises(ValueError, match="free"):
        pool.take(1)


def shared_prefix_workload(vocab: int, seed: int = 0):
    """A 192-token system prompt, then 1-4 tokens of each request's own."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(192)]
    return [system + [rng.randrange(vocab) for _ in range(rng.randint(1, 4))] for _ in range(24)]


def test_shared_prefix_same_tokens_on_and_off_and_hit_rate_over_90_percent(gen):
    prompts = shared_prefix_workload(gen.tokenizer.get_vocab_size())
    params = SamplingParams(max_new_tokens=6)
    jobs = [(p, params) for p in prompts]
    off = Engine(gen, max_slots=8, prefill_chunk=256, enable_prefix_caching=False)
    on = Engine(gen, max_slots=8, prefill_chunk=256)
    assert run_all(on, jobs) == run_all(off, jobs)
    stats = on.stats()
    assert stats["prefix_cache_hit_rate"] > 0.9, stats
    assert off.stats()["prefix_cache_hits"] == 0
    # the first request computed the prefix; the others waited a step for it, then shared it
    assert on.prefill_chunks < off.prefill_chunks or on.steps <= off.steps
    assert all_blocks_free(on) and all_blocks_free(off)
    assert stats["kv_blocks_cached"] >= 192 // 16  # the prefix stays cached after the requests


def test_multi_turn_chat_and_n4_siblings_share_their_prefix(gen):
    vocab = gen.tokenizer.get_vocab_size()
    rng = random.Random(1)
    turn = SamplingParams(max_new_tokens=20)
    engines = {flag: Engine(gen, max_slots=4, enable_prefix_caching=flag) for flag in (1, 0)}
    chats = {flag: [[rng.randrange(vocab) for _ in range(30)] for _ in range(3)] for flag in (1,)}
    chats[0] = [list(c) for c in chats[1]]
    user_turns = [[[rng.randrange(vocab) for _ in range(5)] for _ in range(3)] for _ in range(3)]
    for t in range(3):  # each chat's next prompt: the whole history, the answer, a new message
        answers = {
            flag: run_all(engines[flag], [(c, turn) for c in chats[flag]]) for flag in (1, 0)
        }
        assert answers[1] == answers[0]
        for flag in (1, 0):
            for c, answer, user in zip(chats[flag], answers[flag], user_turns[t], strict=True):
                c += answer + user
    hits = engines[1].stats()
    # turns 2 and 3 find the earlier turns' full blocks (the answers' blocks included)
    assert hits["prefix_cache_hits"] >= 3 * 2 * 48, hits
    sampled = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3)
    siblings = [(chats[1][0], sampled.model_copy(update={"seed": k})) for k in range(4)]
    before = engines[1].stats()["prefix_cache_hits"]
    assert run_all(engines[1], siblings) == run_all(engines[0], siblings)
    prompt = len(chats[1][0])
    # 3 of the 4 siblings (at least) reuse the prompt's full blocks
    assert engines[1].stats()["prefix_cache_hits"] - before >= 3 * (prompt - 1) // 16 * 16
    assert all(all_blocks_free(e) for e in engines.values())


def test_no_block_leaks_over_1000_requests_with_cancellations(gen):
    vocab = gen.tokenizer.get_vocab_size()
    rng = random.Random(2)
    system = [rng.randrange(vocab) for _ in range(20)]
    engine = Engine(gen, max_slots=16, prefill_chunk=64, block_size=4)
    requests = []
    for i in range(1000):
        ids = (system if i % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
        r = engine.submit(ids, SamplingParams(max_new_tokens=rng.randint(1, 3)), lambda e: None)
        if i % 7 == 0:
            engine.cancel(r)  # before it runs
        requests.append(r)
    cancel_later = requests[3::11]
    for step, _ in enumerate(engine.run(requests)):
        if step == 5:
            for r in cancel_later:
                engine.cancel(r)  # while they run or wait
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert all_blocks_free(engine)
    assert engine.stats()["prefix_cache_hits"] > 0
    assert all(r.seq.done or r.cancelled for r in requests)
    assert sum(r.seq.done for r in requests) > 700


def test_preemption_under_a_tiny_block_budget_answers_every_request(gen):
    vocab = gen.tokenizer.get_vocab_size()
    rng = random.Random(3)
    jobs = [
        (
            [rng.randrange(vocab) for _ in range(rng.randint(10, 60))],
            SamplingParams(max_new_tokens=rng.randint(10, 40)),
        )
        for _ in range(12)
    ]
    expected = run_all(Engine(gen, max_slots=12), jobs)
    for caching in (True, False):
        # 16 blocks of 16 tokens (one context): 12 sequences of up to 100 tokens cannot all fit
        tight = Engine(gen, max_slots=12, num_blocks=17, enable_prefix_caching=caching)
        assert run_all(tight, jobs) == expected
        assert tight.stats()["num_preemptions"] > 0
        assert all_blocks_free(tight)
