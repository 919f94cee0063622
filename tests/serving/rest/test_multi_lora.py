"""Multi-LoRA over the OpenAI routes, in-process over the local backend: adapters chosen by
`model` give their merged model's greedy text, batched with the base and each other; `/v1/models`
lists them (parent = the base, valid against OpenAI's schema); vLLM's load/unload routes work
while requests run and lose none; unknown names and bad folders get 4xx naming the field."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from kiln.engine.generator import Generator
from kiln.engine.lora_config import LoRAServingConfig
from kiln.engine.sampler import SamplingParams
from kiln.model.lora import LoRAConfig
from kiln.serving.api.protocol import Limits
from kiln.serving.api.server import create_api
from kiln.serving.backends.backend import BatchingConfig
from kiln.serving.backends.local import LocalBackend
from tests.engine.lora_fixtures import make_adapter
from tests.serving.rest.test_openai_schema import _events, assert_valid

PROMPTS = ["the quick brown fox", "kiln turns raw text", "hello world, this", "ray serve"]
MAX_TOKENS = 8
CONFIGS = {
    "alpha": LoRAConfig(rank=4, alpha=8),
    "beta": LoRAConfig(rank=8, alpha=16, targets=["wq", "wk", "wv", "wo"]),
    "gamma": LoRAConfig(rank=2, alpha=4, targets=["w1", "w2", "w3"]),
}


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """(app over a backend serving alpha and beta from the start, {name: folder},
    {name or None: reference generator of the merged model})."""
    root = tmp_path_factory.mktemp("rest-loras")
    base = Generator.load(tiny_model_dir)
    folders, refs = {}, {}
    for seed, (name, cfg) in enumerate(CONFIGS.items(), start=1):
        folders[name] = str(root / name)
        merged = make_adapter(base.model, cfg, folders[name], seed, std=0.5)
        refs[name] = Generator(merged, base.tokenizer)
    lora = LoRAServingConfig(adapters={k: folders[k] for k in ("alpha", "beta")}, max_loras=2)
    backend = LocalBackend(tiny_model_dir, "tiny", BatchingConfig(max_batch_size=16), lora=lora)
    for ref in [*refs.values(), base]:  # the served model's end-of-turn stops too
        ref.eos_token_ids = backend.generator.eos_token_ids
    refs[None] = base
    yield create_api(backend, Limits(max_new_tokens=MAX_TOKENS)), folders, refs
    asyncio.run(backend.close())


def want(refs, model: str | None, prompt: str) -> str:
    greedy = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0)
    return refs[model].generate([prompt], greedy)[0].text


async def complete(client: httpx.AsyncClient, model: str | None, prompt: str) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    return await client.post("/v1/completions", json=body | ({"model": model} if model else {}))


def run(app, scenario):
    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln") as client:
            return await scenario(client)

    return asyncio.run(main())


def test_each_adapter_answers_as_its_merged_model_in_one_batch(served):
    app, _, refs = served
    jobs = [(m, p) for p in PROMPTS for m in (None, "tiny", "alpha", "beta")]
    texts = {(m, p): want(refs, m if m != "tiny" else None, p) for m, p in jobs}
    assert sum(texts[("alpha", p)] != texts[(None, p)] for p in PROMPTS) >= 2  # adapters matter

    async def scenario(client):
        return await asyncio.gather(*(complete(client, m, p) for m, p in jobs))

    for (m, p), r in zip(jobs, run(app, scenario), strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == texts[(m, p)], (m, p)
        assert r.json()["model"] == (m or "tiny")


def test_models_lists_the_adapters_with_the_base_as_parent(served):
    app, folders, _ = served

    async def scenario(client):
        return [await client.get(path) for path in ("/v1/models", "/v1/models/beta")]

    listed, one = run(app, scenario)
    assert_valid("ListModelsResponse", listed.json())
    assert_valid("Model", one.json())
    cards = {c["id"]: c for c in listed.json()["data"]}
    assert {"tiny", "alpha", "beta"} <= set(cards)
    assert cards["tiny"]["parent"] is None and cards["alpha"]["parent"] == "tiny"
    assert one.json()["id"] == "beta" and one.json()["parent"] == "tiny"
    assert one.json()["root"] == folders["beta"] and cards["tiny"]["root"] == "tiny"


def test_a_streamed_chat_names_the_adapter_and_equals_its_answer(served):
    app, _, _ = served
    body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    body["temperature"] = 0

    async def scenario(client):
        plain = await client.post("/v1/chat/completions", json=body)
        stream = await client.post("/v1/chat/completions", json={**body, "stream": True})
        return plain, stream

    plain, stream = run(app, scenario)
    chunks = _events(stream)
    assert {c["model"] for c in chunks} == {"alpha"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain.json()["choices"][0]["message"]["content"]


def test_load_and_unload_while_requests_run_lose_no_request(served):
    """24 requests of the base and two adapters run while a third adapter is loaded, used and
    unloaded three times (three adapters, two slots: slots are evicted and reloaded under load):
    every request answers 200 with its own model's text."""
    app, folders, refs = served
    jobs = [(m, p) for _ in range(2) for p in PROMPTS for m in (None, "alpha", "beta")]
    texts = {(m, p): want(refs, m, p) for m, p in {*jobs, *(("gamma", p) for p in PROMPTS)}}

    async def churn(client):
        answers = []
        for _ in range(3):
            load = {"lora_name": "gamma", "lora_path": folders["gamma"]}
            r = await client.post("/v1/load_lora_adapter", json=load)
            assert r.status_code == 200 and "gamma" in r.text, r.text
            answers += [(p, await complete(client, "gamma", p)) for p in PROMPTS[:2]]
            r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "gamma"})
            assert r.status_code == 200, r.text
        return answers

    async def scenario(client):
        return await asyncio.gather(churn(client), *(complete(client, m, p) for m, p in jobs))

    gamma, *answers = run(app, scenario)
    for (m, p), r in zip(jobs, answers, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == texts[(m, p)], (m, p)
    for p, r in gamma:
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == texts[("gamma", p)]

    async def after(client):
        return await complete(client, "gamma", PROMPTS[0]), await client.get("/metrics")

    unloaded, metrics = run(app, after)
    stats = app.state.backend.engine_stats()
    assert stats["lora_slot_evictions"] >= 1 and stats["num_requests_running"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert unloaded.status_code == 404 and "'gamma'" in unloaded.json()["error"]["message"]
    assert 'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",' in metrics.text


ERRORS = {
    "unknown model": ("/v1/completions", {"model": "delta", "prompt": "x"}, 404, "model"),
    "unknown unload": ("/v1/unload_lora_adapter", {"lora_name": "delta"}, 404, "lora_name"),
    "bad path": (
        "/v1/load_lora_adapter",
        {"lora_name": "delta", "lora_path": "/nonexistent/adapter"},
        400,
        "lora_path",
    ),
    "name taken": (
        "/v1/load_lora_adapter",
        {"lora_name": "alpha", "lora_path": "/nonexistent/adapter"},
        400,
        "lora_name",
    ),
    "base name": (
        "/v1/load_lora_adapter",
        {"lora_name": "tiny", "lora_path": "/nonexistent/adapter"},
        400,
        "lora_name",
    ),
    "no name": ("/v1/load_lora_adapter", {"lora_path": "/x"}, 400, "lora_name"),
}


@pytest.mark.parametrize("case", ERRORS.values(), ids=ERRORS.keys())
def test_bad_lora_requests_get_one_line_4xx_naming_the_field(served, case):
    app, _, _ = served
    path, body, status, field = case

    async def scenario(client):
        return await client.post(path, json=body)

    r = run(app, scenario)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == field and "\n" not in error["message"]
    assert_valid("ErrorResponse", r.json())
    if field in body:  # the message quotes the value it refuses
        assert repr(body[field]) in error["message"], error["message"]


def test_a_server_without_lora_refuses_loads(api_client):
    r = api_client.post(
        "/v1/load_lora_adapter",
        json={"lora_name": "a", "lora_path": "/x"},
        headers={"Authorization": "Bearer test-key"},
    )
    assert r.status_code == 400 and "--lora" in r.json()["error"]["message"], r.text
    assert json.loads(r.text)["error"]["param"] is None
