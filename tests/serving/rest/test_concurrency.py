"""200 concurrent requests over all three protocols: every one answered, none with a 5xx."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.serving.rest.conftest import API_KEY

N = 200


def _request(i: int) -> tuple[str, dict]:
    prompt = f"request {i}: the quick brown fox"
    kind = i % 4
    if kind == 0:
        return "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    if kind == 1:
        return "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0.8, "seed": i}
    if kind == 2:
        return "/v2/models/tiny/generate", {"text_input": prompt, "max_tokens": 2}
    return "/v2/models/tiny/infer", {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
        "parameters": {"max_tokens": 2},
    }


async def _fire(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, limits=limits, timeout=300
    ) as client:
        return await asyncio.gather(
            *(client.post(path, json=body) for path, body in map(_request, range(N)))
        )


@pytest.mark.slow  # a load test: 200 requests through Serve
def test_200_concurrent_requests_no_5xx(endpoint, generator):
    from kiln.engine.sampler import SamplingParams

    responses = asyncio.run(_fire(endpoint.url))
    statuses = [r.status_code for r in responses]
    assert not [s for s in statuses if s >= 500]
    assert statuses == [200] * N
    # batched under load, greedy answers still equal the in-process ones
    prompts = [f"request {i}: the quick brown fox" for i in range(0, N, 4)]
    expected = [c.text for c in generator.generate(prompts, SamplingParams(max_new_tokens=2))]
    got = [responses[i].json()["choices"][0]["text"] for i in range(0, N, 4)]
    assert got == expected
    # and dynamic batching merged concurrent prompts into fewer generate() calls
    stats = httpx.get(
        f"{endpoint.url}/v2/models/tiny/stats", headers={"Authorization": f"Bearer {API_KEY}"}
    ).json()
    counts = stats["model_stats"][0]
    assert counts["inference_count"] >= N
    assert counts["execution_count"] < counts["inference_count"]
