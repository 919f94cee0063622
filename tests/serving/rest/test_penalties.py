"""Presence, frequency and repetition penalties: transformers' repetition penalty token for
token, OpenAI's presence/frequency definition, and all three through the REST app."""

from __future__ import annotations

import torch

from kiln.engine.sampler import SamplingParams, apply_penalties


def test_greedy_repetition_penalty_equals_transformers(tiny_model_dir, generator):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = generator.encode("the quick brown fox")
    params = SamplingParams(max_new_tokens=16, repetition_penalty=1.8)
    ours = generator.generate_ids([ids], params)[0]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.8,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    assert ours == out[: len(ours)] and len(ours) > 0
    plain = generator.generate_ids([ids], SamplingParams(max_new_tokens=16))[0]
    assert plain != ours  # the penalty changed the greedy path of this looping model


def test_presence_and_frequency_penalties_follow_openai():
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    # prompt tokens do not count; output token 1 twice, token 3 once
    got = apply_penalties(logits, params, prompt_ids=[0, 0], output_ids=[1, 3, 1])
    assert got.tolist() == [1.0, 2.0 - 0.5 - 0.5, 3.0, 4.0 - 0.5 - 0.25]
    rep = apply_penalties(
        torch.tensor([-2.0, 2.0, 1.0]), SamplingParams(repetition_penalty=2.0), [0], [1]
    )
    assert rep.tolist() == [-4.0, 1.0, 1.0]


def test_penalties_through_rest(api_client):
    client = api_client
    body = {"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    for field, value in (("frequency_penalty", 2.0), ("presence_penalty", 2.0)):
        r = client.post("/v1/completions", json={**body, field: value})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] != plain
    r = client.post("/v1/completions", json={**body, "frequency_penalty": 3.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frequency_penalty"
