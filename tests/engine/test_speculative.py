"""Speculative decoding in the engine: prompt lookup (ngram) and draft-model drafts give greedy
output token-identical to plain decoding over 50 repetitive prompts under continuous batching
(and drafts do get accepted); sampled output follows the target's own distribution (chi-square
against exact probabilities on a 4-token vocabulary, for both drafters); rejected drafts'
blocks go back to the pool (no leak, under preemption and cancellation too)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from scipy.stats import chisquare

from kiln.engine import Engine
from kiln.engine.ngram_proposer import NgramProposer
from kiln.engine.rejection_sampler import verify_greedy, verify_sampled
from kiln.engine.sampler import SamplingParams
from kiln.engine.speculative_config import SpeculativeConfig
from kiln.model import Transformer
from kiln.model.lora import LoRAConfig
from kiln.platform.errors import InputError
from tests.engine.lora_fixtures import make_adapter
from tests.engine.tiny import tiny_config, tiny_model

VOCAB = 64


@dataclass
class Target:
    """What the engine decodes for, without a tokenizer (token-id prompts, no stop strings)."""

    model: torch.nn.Module
    max_seq_len: int = 256
    eos_token_ids: set[int] = field(default_factory=set)
    tokenizer: object = None

    @property
    def device(self) -> torch.device:
        return self.model.tok_embeddings.weight.device

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def layer_skip_draft(target: Transformer) -> Transformer:
    """A smaller model of the same vocabulary: the target's first layer only (so its guesses are
    often, not always, right)."""
    cfg = target.cfg.model_copy(update={"n_layers": 1})
    draft = Transformer(cfg)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("layers.1.")}
    draft.load_state_dict(state)
    return draft.eval()


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Short token patterns repeated (code, tables, extraction): prompt lookup finds them."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        pattern = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 7))]
        prompts.append((pattern * 12)[: rng.randint(6, 40)])
    return prompts


def run(engine: Engine, jobs, check=None, cancel=()) -> list[list[int]]:
    """Submit every (prompt, params) job at once; step until all finish, calling `check`
    after each step and cancelling the requests numbered in `cancel` at the third step."""
    requests = [engine.submit(ids, p, lambda e: None) for ids, p in jobs]
    for step, _ in enumerate(engine.run(requests)):
        if step == 3:
            for i in cancel:
                engine.cancel(requests[i])
        if check:
            check(engine)
    for r in requests:
        assert r.error is None, r.error
    return [r.seq.token_ids for r in requests]


def rolled_back(engine: Engine) -> None:
    """Between steps a running request holds the blocks of its computed tokens and no more:
    rejected drafts' blocks were returned (the draft model's likewise)."""
    bs = engine.kv.block_size
    for r in engine.scheduler.running:
        assert len(r.blocks) == -(-r.computed // bs), (len(r.blocks), r.computed)
    draft = engine.speculator.draft
    if draft is not None:
        for _, state in draft.states.values():
            assert len(state.blocks) == -(-state.computed // bs)


def all_free(engine: Engine) -> None:
    pool = engine.kv.pool
    assert pool.num_free == pool.num_blocks and all(b.ref_cnt == 0 for b in pool.blocks)
    draft = engine.speculator.draft
    if draft is not None:
        assert draft.pool.num_free == draft.pool.num_blocks and not draft.states


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("llama", VOCAB, max_seq_len=256))


def test_ngram_proposer_takes_the_longest_most_recent_match():
    p = NgramProposer(min_n=1, max_n=3)
    assert p.propose([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]  # 3-gram, latest
    assert p.propose([4, 1, 2, 8, 1, 2], 3) == [8, 1, 2]
    assert p.propose([5, 6, 7], 2) == []  # nothing repeats
    assert p.propose([3, 3], 4) == [3]  # the match may run into the suffix itself
    assert NgramProposer(min_n=2, max_n=3).propose([1, 5, 2, 1], 2) == []  # 1-gram too short


def test_verification_rules():
    assert verify_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all kept, one bonus
    assert verify_greedy([4, 9, 6], [4, 5, 6, 7]) == [4, 5]  # corrected at the first miss
    # a point-mass draft the target gives no mass is always rejected, never emitted
    logits = torch.tensor([[0.0, -float("inf"), 0.0], [0.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0)
    for _ in range(20):
        assert verify_sampled([1], logits, params, gen)[0] != 1


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_is_token_identical_to_plain_decoding(target, method):
    rng = random.Random(1)
    prompts = repetitive_prompts(50)
    jobs = [(p, SamplingParams(max_new_tokens=rng.randint(4, 40))) for p in prompts]
    plain = run(Engine(target, max_slots=8, prefill_chunk=64), jobs)
    # end some sequences early too: the token plain decoding emits most often is end-of-text
    counts = torch.bincount(torch.tensor([t for out in plain for t in out]), minlength=VOCAB)
    eos_target = Target(target.model, eos_token_ids={int(counts.argmax())})
    plain_eos = run(Engine(eos_target, max_slots=8, prefill_chunk=64), jobs)
    assert any(len(a) < len(b) for a, b in zip(plain_eos, plain, strict=True))
    config = SpeculativeConfig(method=method, model="draft" if method != "ngram" else None)
    draft = layer_skip_draft(target.model) if method == "draft_model" else None
    for tgt, expected in ((target, plain), (eos_target, plain_eos)):
        spec = Engine(tgt, max_slots=8, prefill_chunk=64, speculative=config, draft_model=draft)
        assert run(spec, jobs, check=rolled_back) == expected
        stats = spec.stats()
        assert stats["spec_decode_num_accepted_tokens"] > 0, stats
        assert stats["spec_decode_num_drafts"] > 0
        assert (
            sum(stats["spec_decode_num_accepted_tokens_per_pos"])
            == (stats["spec_decode_num_accepted_tokens"])
        )
        all_free(spec)


def test_each_accepted_draft_saves_one_target_forward(target):
    """One request at a time: plain decoding runs a forward per token; speculation runs the
    same text in exactly (accepted drafts) fewer forwards."""
    jobs = [(p, SamplingParams(max_new_tokens=32)) for p in repetitive_prompts(8, seed=3)]
    plain = Engine(target, max_slots=1, prefill_chunk=64)
    spec = Engine(target, max_slots=1, prefill_chunk=64, speculative=SpeculativeConfig())
    assert run(spec, jobs) == run(plain, jobs)
    accepted = spec.stats()["spec_decode_num_accepted_tokens"]
    assert accepted > 0
    assert plain.steps - spec.steps == accepted
    assert spec.stats()["spec_decode_mean_acceptance_length"] > 1.0


def test_disabled_while_many_rows_decode(target):
    """`disable_by_batch_size`: rows decoding in lockstep at or above it never speculate; a lone
    row does."""
    spec = SpeculativeConfig(disable_by_batch_size=3)
    # three prompts of one length, under one block (none waits for another's cached prefix),
    # all admitted in the first step: they decode together to the end
    prompts = [[i + 1, i + 2, i + 3] * 4 for i in range(3)]
    jobs = [(p, SamplingParams(max_new_tokens=32)) for p in prompts]
    crowded = Engine(target, max_slots=3, prefill_chunk=64, speculative=spec)
    plain = run(Engine(target, max_slots=3, prefill_chunk=64), jobs)
    assert run(crowded, jobs) == plain
    assert crowded.stats()["spec_decode_num_drafts"] == 0
    alone = Engine(target, max_slots=3, prefill_chunk=64, speculative=spec)
    assert run(alone, jobs[:1]) == plain[:1]
    assert alone.stats()["spec_decode_num_drafts"] > 0


def test_lora_rows_decode_plainly_beside_speculating_base_rows(target, tmp_path):
    """An adapter's rows are not verified by the base model's forward: they decode as the
    merged adapter model does, while base rows in the same steps speculate."""
    merged = make_adapter(target.model, LoRAConfig(rank=4, alpha=8), str(tmp_path / "a"), 1)
    prompts = repetitive_prompts(6, seed=9)
    greedy = SamplingParams(max_new_tokens=24)
    spec = Engine(target, max_slots=6, max_loras=1, speculative=SpeculativeConfig())
    spec.loras.add("a", str(tmp_path / "a"))
    requests = [
        spec.submit(p, greedy, lambda e: None, lora="a" if i % 2 else None)
        for i, p in enumerate(prompts)
    ]
    for _ in spec.run(requests):
        pass
    base_jobs = [(p, greedy) for p in prompts[0::2]]
    adapter_jobs = [(p, greedy) for p in prompts[1::2]]
    assert [r.seq.token_ids for r in requests[0::2]] == run(Engine(target), base_jobs)
    assert [r.seq.token_ids for r in requests[1::2]] == run(Engine(Target(merged)), adapter_jobs)
    assert spec.stats()["spec_decode_num_drafts"] > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_rollback_leaks_no_blocks_under_preemption_and_cancellation(target, method):
    """A pool too small for the batch: drafts get fewer blocks than they want, requests are
    preempted and recomputed, some are cancelled; every block comes back."""
    target = Target(target.model, max_seq_len=96)  # a pool of 30 blocks holds one context
    jobs = [(p, SamplingParams(max_new_tokens=24)) for p in repetitive_prompts(16, seed=5)]
    small = {"max_slots": 6, "prefill_chunk": 32, "block_size": 4, "num_blocks": 30}
    plain = run(Engine(target, **small), jobs)
    config = SpeculativeConfig(method=method, model="draft" if method != "ngram" else None)
    draft = layer_skip_draft(target.model) if method == "draft_model" else None
    spec = Engine(target, **small, speculative=config, draft_model=draft)
    out = run(spec, jobs, check=rolled_back, cancel=(2, 7))
    assert spec.stats()["num_preemptions"] > 0
    assert [o for i, o in enumerate(out) if i not in (2, 7)] == [
        o for i, o in enumerate(plain) if i not in (2, 7)
    ]
    spec._retire()
    all_free(spec)


# ---- sampled output: the target's own distribution -----------------------------------------

TINY_VOCAB = 4
PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
NEW = 4  # tokens sampled per request: the first by prefill, then k=2 drafts + one more
SAMPLES = 4000


def exact_joint(model: Transformer, temperature: float) -> torch.Tensor:
    """P(t1..t4 | PROMPT) for all 4^4 continuations, from full forwards (no cache, no engine)."""
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = [[]]
    for _ in range(NEW):
        ids = torch.tensor([PROMPT + p for p in prefixes])
        with torch.no_grad():
            logits = model(ids)[:, -1].double()
        probs = torch.softmax(logits / temperature, dim=-1)  # [len(prefixes), V]
        joint = (joint[:, None] * probs).reshape(-1)
        prefixes = [p + [t] for p in prefixes for t in range(TINY_VOCAB)]
    return joint


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against probabilities; cells expected under 5 pooled."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]]).numpy()
    exp = torch.cat([expected[~small], expected[small].sum()[None]]).numpy()
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_output_follows_the_target_distribution(method):
    target = Target(tiny_model("llama", TINY_VOCAB, max_seq_len=64))
    # an unrelated random draft: its q differs from p, so min(1, p/q) and the residual matter
    draft = tiny_model("llama", TINY_VOCAB, seed=7, n_layers=1) if method != "ngram" else None
    config = SpeculativeConfig(
        method=method,
        model="draft" if draft is not None else None,
        num_speculative_tokens=2,
        prompt_lookup_min=1,
    )
    engine = Engine(target, max_slots=128, speculative=config, draft_model=draft)
    temperature = 0.9
    jobs = [
        (PROMPT, SamplingParams(temperature=temperature, seed=i, max_new_tokens=NEW))
        for i in range(SAMPLES)
    ]
    outs = run(engine, jobs)
    stats = engine.stats()
    # drafts were both kept and rejected (the test exercises both branches)
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    codes = torch.tensor([sum(t * TINY_VOCAB**i for i, t in enumerate(reversed(o))) for o in outs])
    counts = torch.bincount(codes, minlength=TINY_VOCAB**NEW).double()
    probs = exact_joint(target.model, temperature)
    assert chi_square_p(counts, probs) > 1e-3
    # the test has the power to see a slightly different distribution
    assert chi_square_p(counts, exact_joint(target.model, temperature * 1.25)) < 1e-3


def test_bad_speculative_options_name_the_field(target):
    with pytest.raises(ValueError, match="speculative.model"):
        SpeculativeConfig(method="draft_model")
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig(prompt_lookup_min=5, prompt_lookup_max=3)
    other_vocab = tiny_model("llama", VOCAB + 8)
    with pytest.raises(InputError, match="speculative.model: its vocabulary"):
        Engine(target, speculative=SpeculativeConfig(model="x"), draft_model=other_vocab)
    with pytest.raises(InputError, match="no such model directory"):
        Engine(target, speculative=SpeculativeConfig(model="/nonexistent/draft"))
    assert tiny_config  # the shapes module stays the one source of tiny models
