"""Rollouts on Kiln's engine: the engine's sampling log-probs equal the trainer's recomputed
ones (fp32 CPU), before and after a refit."""

import copy
from functools import cache

import torch

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model import ModelConfig, Transformer, native_ops
from kiln.model.attention import set_attention_backend
from kiln.training.rl.logprobs import completion_logprobs, mismatch
from kiln.training.rl.refit import refit
from kiln.training.rl.rollout import RolloutEngine, generate_rollouts
from tests.engine.tiny import tiny_model, train_tokenizer

PARAMS = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9)


@cache
def _tokenizer():
    return train_tokenizer()


def _setup(policy=None):
    tok = _tokenizer()
    policy = policy if policy is not None else tiny_model("llama", tok.get_vocab_size()).train()
    engine_model = copy.deepcopy(policy)
    gen = Generator(engine_model, tok, eos_token_ids=[0])
    prompts = [tok.encode("the quick brown fox").ids, tok.encode("hello world, this").ids[:3]]
    return tok, policy, gen, prompts


def _worst_mismatch(policy, rollouts, temperature=0.8):
    scores = completion_logprobs(
        policy, [r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], temperature
    )
    engine = torch.zeros_like(scores.logp)
    for i, r in enumerate(rollouts):
        engine[i, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float64)
    return mismatch(engine, scores.logp, scores.mask), scores


def test_engine_logprobs_equal_trainer_recompute_before_and_after_refit():
    _, policy, gen, prompts = _setup()
    rollouts = generate_rollouts(gen, prompts, group_size=3, params=PARAMS, seed=7)
    assert [r.prompt_index for r in rollouts] == [0, 0, 0, 1, 1, 1]
    assert all(len(r.completion_ids) == len(r.logprobs) > 0 for r in rollouts)
    assert len({tuple(r.completion_ids) for r in rollouts}) > 1  # the group is sampled, not copied
    (mean, worst), scores = _worst_mismatch(policy, rollouts)
    assert worst < 1e-5, (mean, worst)

    # one optimizer step moves the policy away from the engine's copy ...
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    (-(scores.logp * scores.mask).sum()).backward()
    opt.step()
    (_, stale), _ = _worst_mismatch(policy, rollouts)
    assert stale > 1e-3
    # ... and the refit brings the engine level with it
    seconds = refit(policy, gen.model)
    assert seconds >= 0
    engine_state = gen.model.state_dict()
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, engine_state[name]), name
    rollouts = generate_rollouts(gen, prompts, group_size=3, params=PARAMS, seed=7)
    (_, worst), _ = _worst_mismatch(policy, rollouts)
    assert worst < 1e-5


def _invariant_policy(vocab_size: int) -> Transformer:
    """64-wide heads (SmolLM2's), GQA, flat enough logits for long completions; the batch-
    invariant attention the RL loops switch on."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=vocab_size, dim=128, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden_dim=256,
        max_seq_len=160,
    )  # fmt: skip
    policy = Transformer(cfg).train()
    set_attention_backend(policy, "invariant")
    return policy


def test_invariant_engine_logprobs_are_the_trainers_bit_for_bit():
    """With the batch-invariant attention the engine's sampling log-probs (KV-cache decode,
    prefix-cached prompts, decode steps of 1 to 12 rows padded to the engine's exact row count)
    equal the trainer's recomputed ones exactly on CPU fp32, before and after a refit."""
    _, policy, gen, prompts = _setup(_invariant_policy(_tokenizer().get_vocab_size()))
    params = SamplingParams(max_new_tokens=96, temperature=1.0)
    for step in range(2):
        rollouts = generate_rollouts(gen, prompts, group_size=6, params=params, seed=11)
        assert sum(len(r.completion_ids) for r in rollouts) > 300  # long completions, ragged
        (mean, worst), scores = _worst_mismatch(policy, rollouts, temperature=1.0)
        assert worst == 0.0, (step, mean, worst)
        # a step of the policy, then the refit: the engine follows exactly
        opt = torch.optim.SGD(policy.parameters(), lr=0.05)
        (-(scores.logp * scores.mask).sum()).backward()
        opt.step()
        refit(policy, gen.model)


def test_a_batch_invariant_engine_never_builds_the_paged_attention_op(monkeypatch):
    """The op computes plain softmax attention, which the invariant cores never run: a rollout
    engine must not pay its build (~30 s on a fresh machine), neither at start nor on a packed
    step. The same model on SDPA, which would use it, does load it."""
    loads = []
    monkeypatch.setattr(native_ops, "_loaded", {})
    monkeypatch.setattr(native_ops, "_build", lambda name, *_: loads.append(name) or False)
    _, _, gen, prompts = _setup(_invariant_policy(_tokenizer().get_vocab_size()))
    packed = []
    monkeypatch.setattr(RolloutEngine, "_packed", _recording(RolloutEngine._packed, packed))
    assert generate_rollouts(gen, prompts, group_size=3, params=PARAMS, seed=7)
    assert packed  # packed steps ran, whose batches used to ask for the op
    assert loads == []
    set_attention_backend(gen.model, "sdpa")
    generate_rollouts(gen, prompts, group_size=3, params=PARAMS, seed=7)
    assert loads == ["paged_attention"]


def _recording(method, calls: list):
    def recorded(self, *args):
        calls.append(args)
        return method(self, *args)

    return recorded


def test_a_seed_repeats_its_rollouts():
    _, _, gen, prompts = _setup()
    first = generate_rollouts(gen, prompts, group_size=2, params=PARAMS, seed=3)
    again = generate_rollouts(gen, prompts, group_size=2, params=PARAMS, seed=3)
    assert [r.completion_ids for r in first] == [r.completion_ids for r in again]
    assert [r.logprobs for r in first] == [r.logprobs for r in again]
