"""Scoring a prompt through /v1/completions (echo + logprobs), in-process: the edge cases that
log-likelihood harnesses depend on."""

from __future__ import annotations

from kiln.engine.sampler import SamplingParams


def test_echo_logprobs_list_the_end_of_text_token(api_client, local_backend):
    """When an end-of-text token ends the completion, echo + logprobs still lists one entry
    past the prompt (the eos), as vLLM does and lm-evaluation-harness expects."""
    gen = local_backend.generator
    ids = gen.encode("a kiln fires clay")
    (greedy,) = gen.generate_ids([ids], SamplingParams(max_new_tokens=1))
    client = api_client
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    gen.eos_token_ids.add(greedy[0])
    try:
        r = client.post("/v1/completions", json=body).json()
    finally:
        gen.eos_token_ids.discard(greedy[0])
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 0
    assert len(lp["token_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())


def test_echo_with_max_tokens_zero_scores_the_prompt_only(api_client, local_backend):
    ids = local_backend.generator.encode("the quick brown fox")
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0}
    r = api_client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) and r.json()["usage"]["completion_tokens"] == 0
    r = api_client.post("/v1/completions", json={**body, "echo": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_triton_generate_takes_vllm_fields(api_client, local_backend):
    """Triton's generate extension as vLLM's backend speaks it: `sampling_parameters` as a
    JSON string, `exclude_input_in_output`; unknown top-level fields are a 400."""
    gen = local_backend.generator
    expected = gen.generate(["a kiln"], SamplingParams(max_new_tokens=5))[0].text
    body = {"text_input": "a kiln", "sampling_parameters": '{"max_tokens": 5, "temperature": 0}'}
    r = api_client.post("/v2/models/tiny/generate", json=body)
    assert r.status_code == 200 and r.json()["text_output"] == expected, r.text
    r = api_client.post("/v2/models/tiny/generate", json={**body, "exclude_input_in_output": False})
    assert r.json()["text_output"] == "a kiln" + expected
    for bad in ({"sampling_parameters": "{"}, {"sampling_parameters": '{"top_p": 2}'}, {"x": 1}):
        r = api_client.post("/v2/models/tiny/generate", json={**body, **bad})
        assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
