"""Every OpenAI response body and streamed chunk Kiln sends is valid against OpenAI's own
published schemas (a vendored copy: openai_schemas.json), for completions, chat completions,
models and errors, under the options clients use; and a seeded stream ends with the finish
reason the same request gets without streaming.

OpenAI's documented exceptions are allowed, and only they: a streamed completion chunk's
`finish_reason` is null until the last chunk, and echo's first token has a null log-prob."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).with_name("openai_schemas.json")
PROMPT = "the quick brown fox"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]


@cache
def _validator(name: str) -> Draft202012Validator:
    document = json.loads(SCHEMAS.read_text())
    return Draft202012Validator({**document, "$ref": f"#/$defs/{name}"})


def assert_valid(name: str, body: dict) -> None:
    errors = sorted(_validator(name).iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{name} at {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in errors
    )


def _events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = [ln[len("data: ") :] for ln in response.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(ln) for ln in lines[:-1]]


def _completion_chunk(chunk: dict) -> dict:
    """A streamed completion chunk as the schema has it: OpenAI sends `finish_reason: null`
    on every chunk but the last (its documented exception for the legacy completions stream)."""
    choices = [
        {**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk.get("choices", [])
    ]
    return {**chunk, "choices": choices}


def _echo(body: dict) -> dict:
    """echo + logprobs: the prompt's first token has no log-prob (null, as OpenAI sends it)."""
    for choice in body["choices"]:
        lp = choice["logprobs"]
        lp["token_logprobs"] = [0.0 if v is None else v for v in lp["token_logprobs"]]
        lp["top_logprobs"] = [{} if v is None else v for v in lp["top_logprobs"]]
    return body


def _streamable(options: dict) -> bool:
    """What Kiln streams: one prompt, n=1, no log-probs (the rest is refused with a 400)."""
    several = isinstance(options.get("prompt"), list) and isinstance(options["prompt"][0], str)
    return not (several or options.get("n", 1) > 1 or "logprobs" in options or "echo" in options)


COMPLETIONS = {
    "plain": {},
    "logprobs": {"logprobs": 2},
    "n=2 sampled": {"n": 2, "temperature": 1.0, "seed": 3},
    "stop": {"stop": ["fox"], "max_tokens": 16},
    "token ids": {"prompt": [1, 2, 3]},
    "several prompts": {"prompt": ["a b", "c d e"]},
    "echo + logprobs": {"echo": True, "logprobs": 1},
}


@pytest.mark.parametrize("options", COMPLETIONS.values(), ids=COMPLETIONS.keys())
def test_completion_bodies_and_chunks_follow_openai_schema(api_client, options):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **options}
    r = api_client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert_valid("CreateCompletionResponse", _echo(answer) if options.get("echo") else answer)
    if not _streamable(options):
        return
    for extra in ({}, {"stream_options": {"include_usage": True}}):
        chunks = _events(api_client.post("/v1/completions", json={**body, "stream": True, **extra}))
        for chunk in chunks:
            assert_valid("CreateCompletionResponse", _completion_chunk(chunk))
        if extra:
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


CHATS = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "n=2 sampled": {"n": 2, "temperature": 1.0, "seed": 3},
    "stop": {"stop": "fox", "max_tokens": 16},
}


@pytest.mark.parametrize("options", CHATS.values(), ids=CHATS.keys())
def test_chat_bodies_and_chunks_follow_openai_schema(api_client, options):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, **options}
    r = api_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert_valid("CreateChatCompletionResponse", r.json())
    if not _streamable(options):
        return
    for extra in ({}, {"stream_options": {"include_usage": True}}):
        stream = api_client.post("/v1/chat/completions", json={**body, "stream": True, **extra})
        chunks = _events(stream)
        for chunk in chunks:
            assert_valid("CreateChatCompletionStreamResponse", chunk)
        if extra:
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_models_follow_openai_schema(api_client):
    listed = api_client.get("/v1/models")
    assert listed.status_code == 200
    assert_valid("ListModelsResponse", listed.json())
    one = api_client.get("/v1/models/tiny")
    assert one.status_code == 200
    assert_valid("Model", one.json())


ERRORS = {
    "unknown model": ("post", "/v1/completions", {"model": "nope", "prompt": "x"}, 404),
    "bad field": ("post", "/v1/completions", {"prompt": "x", "max_tokens": -1}, 400),
    "not JSON": ("post", "/v1/chat/completions", "{", 400),
    "no messages": ("post", "/v1/chat/completions", {"model": "tiny"}, 400),
    "unknown model id": ("get", "/v1/models/nope", None, 404),
}


@pytest.mark.parametrize("case", ERRORS.values(), ids=ERRORS.keys())
def test_error_bodies_follow_openai_schema(api_client, case):
    method, path, body, status = case
    if isinstance(body, str):
        r = api_client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = getattr(api_client, method)(path, **({"json": body} if body is not None else {}))
    assert r.status_code == status, r.text
    assert_valid("ErrorResponse", r.json())


def _finish(api_client, path: str, body: dict) -> tuple[str, str]:
    plain = api_client.post(path, json=body)
    assert plain.status_code == 200, plain.text
    streamed = _events(api_client.post(path, json={**body, "stream": True}))
    reasons = [c["choices"][0]["finish_reason"] for c in streamed if c["choices"]]
    assert all(r is None for r in reasons[:-1]), reasons
    return plain.json()["choices"][0]["finish_reason"], reasons[-1]


@pytest.mark.parametrize("seed", range(20))
def test_seeded_stream_ends_with_the_non_streamed_finish_reason(api_client, seed):
    """Temperature 1.3, a Japanese prompt: the stream's last finish reason is the one the same
    request gets in one piece (stop and length both occur over these seeds)."""
    common = {"model": "tiny", "max_tokens": 12, "temperature": 1.3, "seed": seed}
    body = {**common, "prompt": "窯は粘土を焼いて器にします。"}
    plain, streamed = _finish(api_client, "/v1/completions", body)
    assert streamed == plain
    chat = {**common, "messages": [{"role": "user", "content": "窯は粘土を焼いて器にします。"}]}
    plain, streamed = _finish(api_client, "/v1/chat/completions", chat)
    assert streamed == plain
