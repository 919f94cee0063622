"""Rollouts on Kiln's engine: the engine's sampling log-probs equal the trainer's recomputed
ones (fp32 CPU), before and after a refit."""

import copy
from functools import cache

import torch

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.training.rl.logprobs import completion_logprobs, mismatch
from kiln.training.rl.refit import refit
from kiln.training.rl.rollout import generate_rollouts
from tests.engine.tiny import tiny_model, train_tokenizer

PARAMS = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9)


@cache
def _tokenizer():
    return train_tokenizer()


def _setup():
    tok = _tokenizer()
    policy = tiny_model("llama", tok.get_vocab_size()).train()
    engine_model = copy.deepcopy(policy)
    gen = Generator(engine_model, tok, eos_token_ids=[0])
    prompts = [tok.encode("the quick brown fox").ids, tok.encode("hello world, this").ids[:3]]
    return tok, policy, gen, prompts


def _worst_mismatch(policy, rollouts):
    scores = completion_logprobs(
        policy, [r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts], 0.8
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


def test_a_seed_repeats_its_rollouts():
    _, _, gen, prompts = _setup()
    first = generate_rollouts(gen, prompts, group_size=2, params=PARAMS, seed=3)
    again = generate_rollouts(gen, prompts, group_size=2, params=PARAMS, seed=3)
    assert [r.completion_ids for r in first] == [r.completion_ids for r in again]
    assert [r.logprobs for r in first] == [r.logprobs for r in again]
