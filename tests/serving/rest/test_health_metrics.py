"""`GET /health` and Prometheus `GET /metrics` under vLLM's names: the counts move with requests."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families


def _samples(client) -> dict[str, float]:
    """{sample name: value} of the endpoint's /metrics (one model, so labels are dropped)."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        s.name + ("" if "le" not in s.labels else f"{{le={s.labels['le']}}}"): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if "finished_reason" not in s.labels
    }


def test_health_answers_200(api_client):
    r = api_client.get("/health")
    assert r.status_code == 200


def test_metrics_move_after_requests(api_client):
    before = _samples(api_client)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert before[name] == 0
    body = {"prompt": "the cat sat on", "max_tokens": 6, "temperature": 0}
    r = api_client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    with api_client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        assert sum(1 for line in s.iter_lines() if line.startswith("data: {")) >= 2
    # a stream's handler leaves the backend just after its client read the last event
    deadline = time.monotonic() + 10
    while (after := _samples(api_client))["vllm:num_requests_running"] and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("vllm:prompt_tokens_total") >= 2 * usage["prompt_tokens"]
    assert grew("vllm:generation_tokens_total") >= usage["completion_tokens"] + 1
    assert grew("vllm:e2e_request_latency_seconds_count") == 2
    assert grew("vllm:time_to_first_token_seconds_count") == 1  # the streamed one
    assert grew("vllm:inter_token_latency_seconds_count") >= 1
    assert grew("vllm:time_to_first_token_seconds_sum") > 0
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


def test_health_and_metrics_need_no_api_key(local_backend):
    from starlette.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api

    with TestClient(create_api(local_backend, Limits(), api_key="k")) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.get("/v1/models").status_code == 401


def test_prefix_cache_hits_and_kv_usage_in_metrics(tiny_model_dir):
    """Two requests with one long shared prefix: the second finds its full blocks cached; once
    they end every block is free (an endpoint of its own: no other test's requests running)."""
    from starlette.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend

    backend = LocalBackend(tiny_model_dir, "tiny", BatchingConfig(max_batch_size=4))
    with TestClient(create_api(backend, Limits())) as client:
        before = _samples(client)
        shared = "the quick brown fox jumps over the lazy dog " * 8
        for tail in ("and runs away", "and sleeps"):
            body = {"prompt": shared + tail, "max_tokens": 2, "temperature": 0}
            assert client.post("/v1/completions", json=body).status_code == 200
        # the answer leaves with its last token; the engine thread frees its blocks right after
        deadline = time.monotonic() + 10
        while (after := _samples(client))["vllm:kv_cache_usage_perc"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
    asyncio.run(backend.close())
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert queries > 2 * 32 and hits >= 32  # the second prompt's shared full blocks
    assert hits < queries / 2 + 16
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0  # every block free again
    assert after["vllm:num_preemptions_total"] == 0


def test_a_cache_salt_keeps_cached_prefixes_apart(tiny_model_dir):
    """The same long prefix under another `cache_salt` finds nothing cached; under the same
    salt it finds its full blocks (vLLM's `cache_salt`: one tenant's prefixes are its own)."""
    from starlette.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend

    backend = LocalBackend(tiny_model_dir, "tiny", BatchingConfig(max_batch_size=4))
    shared = "the quick brown fox jumps over the lazy dog " * 8
    hits = []
    with TestClient(create_api(backend, Limits())) as client:
        for salt, tail in (("a", "and runs"), ("b", "and sleeps"), ("a", "and sits")):
            before = _samples(client)["vllm:prefix_cache_hits_total"]
            body = {"prompt": shared + tail, "max_tokens": 1, "temperature": 0, "cache_salt": salt}
            assert client.post("/v1/completions", json=body).status_code == 200
            hits.append(_samples(client)["vllm:prefix_cache_hits_total"] - before)
        chat = {"messages": [{"role": "user", "content": shared}], "max_tokens": 1}
        assert (
            client.post("/v1/chat/completions", json={**chat, "cache_salt": ""}).status_code == 400
        )
    asyncio.run(backend.close())
    assert hits[0] == 0 and hits[1] == 0  # "b" shares nothing with "a"
    assert hits[2] >= 32  # the second "a" request finds the first one's full blocks
