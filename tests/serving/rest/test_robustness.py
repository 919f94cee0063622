"""The 15 requests that once broke `kiln serve` (a 500, a dropped stream, or failing the valid
requests batched beside them), replayed against the Serve endpoint: each gets a 4xx in its
protocol's error format (or, for a value in range, a correct answer); valid requests sent
beside edge ones all succeed."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from kiln.serving.api.protocol import ERROR_CODES
from tests.serving.rest.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


def _infer(name: str, value) -> dict:
    text = {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hello"]}
    return {"inputs": [text, {"name": name, "shape": [1], "datatype": "INT32", "data": [value]}]}


# (path, body): json.dumps keeps "\ud800" as an escape, as a client would send it
REPLAYS = {
    "temperature 1e-45": ("/v1/completions", {"prompt": "hi", "temperature": 1e-45}),
    "temperature 1e-320": ("/v1/completions", {"prompt": "hi", "temperature": 1e-320}),
    "top_p 1e-300": ("/v1/completions", {"prompt": "hi", "temperature": 1, "top_p": 1e-300}),
    "seed 2^64": ("/v1/completions", {"prompt": "hi", "temperature": 0.8, "seed": 2**64}),
    "lone surrogate": ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 4}),
    "prompt over context, stream": (
        "/v1/completions",
        {"prompt": [5] * 599, "max_tokens": 4, "stream": True},
    ),
    "infer max_tokens string": ("/v2/models/tiny/infer", _infer("max_tokens", "4")),
    "infer max_tokens null": ("/v2/models/tiny/infer", _infer("max_tokens", None)),
    "infer max_tokens object": ("/v2/models/tiny/infer", _infer("max_tokens", {"a": 1})),
    "infer top_k string": ("/v2/models/tiny/infer", _infer("top_k", "4")),
    "infer top_k null": ("/v2/models/tiny/infer", _infer("top_k", None)),
    "infer top_k object": ("/v2/models/tiny/infer", _infer("top_k", {"a": 1})),
    "generate tiny temperature": (
        "/v2/models/tiny/generate",
        {"text_input": "hi", "temperature": 1e-45},
    ),
    "generate huge seed": (
        "/v2/models/tiny/generate",
        {"text_input": "hi", "temperature": 0.7, "seed": 2**70},
    ),
    "generate lone surrogate": ("/v2/models/tiny/generate", {"text_input": "\udfff"}),
}


@pytest.mark.parametrize("case", REPLAYS.values(), ids=REPLAYS.keys())
def test_replayed_failures_are_4xx(endpoint, case):
    path, body = case
    r = httpx.post(endpoint.url + path, content=json.dumps(body), headers=AUTH, timeout=60)
    if body.get("top_p") == 1e-300:  # in range: sampling keeps only the top token
        assert r.status_code == 200, r.text
        greedy = httpx.post(
            endpoint.url + path, json={**body, "temperature": 0}, headers=AUTH, timeout=60
        )
        assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
        return
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    if body.get("stream"):  # refused before the stream starts, naming the context
        assert "context" in err["message"]
    if path.startswith("/v1/"):
        assert err["code"] == ERROR_CODES[r.status_code] and err["message"] and err["param"]
    else:
        assert isinstance(err, str) and err


def test_long_prompt_with_truncation_streams_to_done(endpoint):
    body = {"prompt": [5] * 599, "max_tokens": 4, "stream": True}
    body["truncate_prompt_tokens"] = 100
    with httpx.stream(
        "POST", endpoint.url + "/v1/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")


async def _mixed(url: str, valid: list[dict], edge: list[tuple[str, dict]]):
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as client:
        sends = [client.post("/v1/completions", json=b) for b in valid]
        sends += [client.post(p, content=json.dumps(b)) for p, b in edge]
        return await asyncio.gather(*sends)


def test_valid_requests_beside_edge_ones_all_succeed(endpoint, generator):
    from kiln.engine.sampler import SamplingParams

    prompts = [f"batch isolation {i}" for i in range(9)]
    valid = [{"prompt": p, "max_tokens": 6, "temperature": 0} for p in prompts]
    edge = [REPLAYS[k] for k in ("temperature 1e-45", "seed 2^64", "lone surrogate")]
    # and edge values that are valid, so they do join the batch
    edge += [
        ("/v1/completions", {"prompt": "x", "temperature": 1e-5, "top_p": 1e-9, "max_tokens": 4}),
        ("/v1/completions", {"prompt": "y", "temperature": 50.0, "seed": 2**63 - 1}),
        ("/v1/completions", {"prompt": [7] * 499, "max_tokens": 13, "top_k": 10**9}),
    ]
    responses = asyncio.run(_mixed(endpoint.url, valid, edge))
    assert [r.status_code for r in responses[:9]] == [200] * 9
    assert all(r.status_code < 500 for r in responses[9:]), [r.text for r in responses[9:]]
    assert [r.status_code for r in responses[12:]] == [200] * 3
    expected = [c.text for c in generator.generate(prompts, SamplingParams(max_new_tokens=6))]
    assert [r.json()["choices"][0]["text"] for r in responses[:9]] == expected


def test_a_job_that_fails_in_a_batch_fails_alone(local_backend):
    """Per-job error capture: a job the model cannot run (its token ids skip `prepare`'s check)
    shares a batch with valid ones; only it gets an error."""
    from kiln.engine.sampler import SamplingParams
    from kiln.serving.backends.backend import Job

    params = SamplingParams(max_new_tokens=3)
    good = [
        Job(f"prompt {i}", params, local_backend.generator.encode(f"prompt {i}")) for i in range(3)
    ]
    bad = Job([10**6], params, [10**6])  # outside the embedding table

    async def run():
        return await asyncio.gather(
            *(local_backend.complete([j]) for j in [*good, bad]), return_exceptions=True
        )

    outs = asyncio.run(run())
    assert all(isinstance(o, list) for o in outs[:3]), outs
    assert isinstance(outs[3], Exception)
    expected = local_backend.generator.generate([j.prompt for j in good], params)
    assert [o[0].text for o in outs[:3]] == [c.text for c in expected]


@pytest.mark.parametrize("temperature", [1e-5, 1.0, 1e6])
def test_sampling_is_safe_on_extreme_rows(temperature):
    from kiln.engine.sampler import SamplingParams, make_generator, sample_next

    logits = torch.tensor(
        [
            [0.0, 1e30, -1e30, 3.0],
            [float("nan"), 1.0, 2.0, float("inf")],
            [float("-inf")] * 4,
            [float("nan")] * 4,
        ]
    )
    params = [SamplingParams(temperature=temperature, top_p=1e-9, seed=1)] * 4
    out = sample_next(logits, params, [make_generator(p, "cpu") for p in params])
    assert out.tolist()[0] == 1  # the dominant token, however cold or hot
    assert all(0 <= t < 4 for t in out.tolist())


def test_a_stream_that_fails_ends_with_an_error_event(local_backend):
    """Generation failing after the stream started: OpenAI's stream sends an error event and
    then [DONE]; Triton's generate_stream sends {"error": ...}. No dropped connection."""
    from kiln.engine.sampler import SamplingParams
    from kiln.serving.api.openai import routes as rest_openai
    from kiln.serving.api.openai.protocol import CompletionRequest
    from kiln.serving.api.openai.streaming import guarded
    from kiln.serving.api.triton_generate import routes as rest_triton_generate
    from kiln.serving.backends.backend import Job

    bad = Job([10**6], SamplingParams(max_new_tokens=3), [10**6])  # outside the embeddings

    async def collect(events):
        return [e async for e in events]

    req = CompletionRequest(prompt=[1], stream=True)
    events = asyncio.run(collect(guarded(rest_openai._completion_stream(local_backend, bad, req))))
    assert events[-1] == "data: [DONE]\n\n"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "server_error" and error["message"]
    events = asyncio.run(collect(rest_triton_generate._events(local_backend, bad)))
    assert set(json.loads(events[-1].removeprefix("data: "))) == {"error"}
