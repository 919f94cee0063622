"""On-policy distillation: the student samples on Kiln's engine, the teacher scores each sampled
position; the student's reverse KL to the teacher falls on held-out prompts."""

import pytest
import torch

from kiln.platform.errors import ConfigError
from kiln.training.post.divergence import token_divergence
from kiln.training.rl.distill import OnPolicyDistill, format_distill_step
from kiln.training.rl.distill_config import DistillConfig
from tests.engine.tiny import tiny_model, train_tokenizer

TRAIN = ["the quick", "hello world", "kiln turns", "ray serve", "the lazy", "triton and"]
HELD_OUT = ["the brown", "hello tiny", "kiln raw", "ray and"]


def _loop(steps=12, **overrides):
    tok = train_tokenizer()
    student = tiny_model("llama", tok.get_vocab_size(), seed=1)
    teacher = tiny_model("llama", tok.get_vocab_size(), seed=2)
    cfg = DistillConfig(
        steps=steps,
        prompts_per_step=3,
        group_size=2,
        max_new_tokens=8,
        prompt_format="raw",
        optimizer={"lr": 3e-2, "weight_decay": 0.0},
        **overrides,
    )
    rows = [{"prompt": p} for p in TRAIN]
    return OnPolicyDistill(student, teacher, tok, rows, cfg, eos_token_ids=[0])


def test_on_policy_distillation_lowers_held_out_reverse_kl():
    loop = _loop()
    held_out = [{"prompt": p} for p in HELD_OUT]
    before = loop.evaluate(held_out)
    metrics = loop.run(on_step=lambda m: print(format_distill_step(m)))
    after = loop.evaluate(held_out)
    print(f"held-out reverse KL {before:.3f} -> {after:.3f}")
    assert after < 0.75 * before, (before, after)  # measured: 2.83 -> 1.47
    assert len(metrics) == 12 and all(m["refit_s"] >= 0 for m in metrics)
    assert max(m["logprob_mismatch_max"] for m in metrics) < 1e-5
    assert loop.engines_match()  # the engine decodes the updated student


@pytest.mark.parametrize("divergence", ["forward_kl", "jsd"])
def test_forward_kl_and_jsd_train_too(divergence):
    metrics = _loop(steps=4, divergence=divergence, lora={"rank": 4, "alpha": 8}).run()
    assert metrics[-1]["reverse_kl"] < metrics[0]["reverse_kl"]


def test_divergences_match_their_definitions_and_vanish_on_equal_logits():
    torch.manual_seed(0)
    s, t = torch.randn(5, 11), torch.randn(5, 11)
    p, q = s.log_softmax(-1), t.log_softmax(-1)
    reverse = (p.exp() * (p - q)).sum(-1)
    forward = (q.exp() * (q - p)).sum(-1)
    torch.testing.assert_close(token_divergence(s, t, "reverse_kl"), reverse)
    torch.testing.assert_close(token_divergence(s, t, "forward_kl"), forward)
    m = torch.log(0.5 * p.exp() + 0.5 * q.exp())
    jsd = 0.5 * (q.exp() * (q - m)).sum(-1) + 0.5 * (p.exp() * (p - m)).sum(-1)
    torch.testing.assert_close(token_divergence(s, t, "jsd", jsd_beta=0.5), jsd)
    for kind in ("reverse_kl", "forward_kl", "jsd"):
        assert token_divergence(s, s, kind).abs().max() < 1e-6


def test_a_teacher_with_another_vocabulary_is_a_config_error():
    tok = train_tokenizer()
    student = tiny_model("llama", tok.get_vocab_size())
    teacher = tiny_model("llama", tok.get_vocab_size() + 8)
    with pytest.raises(ConfigError, match="distill.teacher"):
        OnPolicyDistill(student, teacher, tok, [{"prompt": "a"}], DistillConfig())
