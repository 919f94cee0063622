"""Structured output and tool calls over the OpenAI routes, in-process over the local backend
(a tiny random model: only the grammar mask makes its output valid).

`response_format` (json_object, json_schema), vLLM's guided_* / structured_outputs, OpenAI
`tools` / `tool_choice` through the real `openai` client (streamed and not), the length case,
400s that name the field, and every body and chunk valid against OpenAI's published schemas."""

from __future__ import annotations

import json

import openai
import pytest
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from kiln.serving.api.protocol import Limits
from kiln.serving.api.server import create_api
from kiln.serving.backends.backend import BatchingConfig
from kiln.serving.backends.local import LocalBackend
from tests.serving.rest.conftest import API_KEY
from tests.serving.rest.test_openai_schema import _completion_chunk, _events, assert_valid
from tests.serving.rest.tiny_model import make_tiny_model

POINT = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "label": {"enum": ["a", "b"]},
    },
    "required": ["x", "label"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 6},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
MESSAGES = [{"role": "user", "content": "the weather in kyoto?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The app over a tiny model whose context holds the tool prompt (~800 of its byte-sized
    tokens) and a whole tool call."""
    model = make_tiny_model(str(tmp_path_factory.mktemp("structured") / "tiny"), max_seq_len=1536)
    backend = LocalBackend(model, "tiny", BatchingConfig(max_batch_size=8))
    with TestClient(create_api(backend, Limits(max_new_tokens=160))) as c:
        yield c


@pytest.fixture(scope="module")
def oai(client):
    """The real `openai` client, over the in-process app (TestClient is an httpx.Client)."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0
    )


def _valid(schema: dict, text: str) -> None:
    errors = list(Draft202012Validator(schema).iter_errors(json.loads(text)))
    assert not errors, (text, errors[0].message)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_response_format_validates_streamed_and_not(client, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": POINT, "strict": True}}
    body = {
        "messages": MESSAGES,
        "response_format": fmt,
        "max_tokens": 64,
        "temperature": temperature,
        "seed": 1,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert_valid("CreateChatCompletionResponse", answer)
    assert answer["choices"][0]["finish_reason"] == "stop"
    _valid(POINT, answer["choices"][0]["message"]["content"])
    chunks = _events(client.post("/v1/chat/completions", json={**body, "stream": True}))
    for chunk in chunks:
        assert_valid("CreateChatCompletionStreamResponse", chunk)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    _valid(POINT, text)


def test_json_object_and_vllm_guided_fields_on_completions(client):
    def complete(**extra) -> dict:
        body = {"prompt": "hello world", "max_tokens": 100, "temperature": 1.0, "seed": 5}
        r = client.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        assert_valid("CreateCompletionResponse", r.json())
        return r.json()["choices"][0]

    schema = {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"]}
    _valid(schema, complete(guided_json=schema)["text"])
    _valid(POINT, complete(structured_outputs={"json": POINT})["text"])
    assert complete(guided_choice=["yes", "no"])["text"] in ("yes", "no")
    assert complete(structured_outputs={"choice": ["up", "down"]})["text"] in ("up", "down")
    assert complete(guided_regex="[0-9]{3}-[a-c]{2}")["text"][3] == "-"
    chunks = _events(
        client.post(
            "/v1/completions",
            json={
                "prompt": "hi",
                "max_tokens": 20,
                "guided_choice": ["left", "right"],
                "stream": True,
            },
        )
    )
    for chunk in chunks:
        assert_valid("CreateCompletionResponse", _completion_chunk(chunk))
    assert "".join(c["choices"][0]["text"] for c in chunks) in ("left", "right")


def test_json_object_is_an_object_and_a_cut_schema_ends_with_length(client):
    body = {"messages": MESSAGES, "response_format": {"type": "json_object"}, "temperature": 0}
    done = client.post("/v1/chat/completions", json={**body, "max_tokens": 160}).json()
    choice = done["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}}
    cut = client.post(
        "/v1/chat/completions", json={**body, "response_format": fmt, "max_tokens": 3}
    )
    assert_valid("CreateChatCompletionResponse", cut.json())
    choice = cut.json()["choices"][0]
    assert choice["finish_reason"] == "length"  # never an incomplete object called complete
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])


BAD = {
    "unsupported keyword": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "format": "nope"}},
            }
        },
        "response_format.json_schema.schema",
    ),
    "no schema": ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    "bad regex": ({"guided_regex": "[a-"}, "guided_regex"),
    "two constraints": (
        {"guided_regex": "a", "guided_choice": ["b"]},
        "guided_regex, guided_choice",
    ),
    "unknown type": ({"response_format": {"type": "yaml"}}, "response_format.type"),
    "tool_choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "unknown named tool": (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_unsupported_constraints_are_400s_naming_the_field(client, case):
    extra, param = case
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, **extra})
    assert r.status_code == 400, r.text
    assert_valid("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["message"].startswith(param.split(", ")[0])


def test_a_grammar_no_text_satisfies_is_a_400_streamed_and_not(client):
    body = {"prompt": "hi", "max_tokens": 8, "guided_grammar": "start: start"}
    for stream in (False, True):  # a stream fails before its first token: a plain 400 too
        r = client.post("/v1/completions", json={**body, "stream": stream})
        assert r.status_code == 400, r.text
        assert_valid("ErrorResponse", r.json())
        assert r.json()["error"]["message"].startswith("guided_grammar: ")


def _arguments_valid(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
    params = tool["function"].get("parameters", {"type": "object", "maxProperties": 0})
    _valid(params, call.function.arguments)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_call_through_the_openai_client(oai, choice):
    answer = oai.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=[WEATHER, CLOCK],
        tool_choice=choice,
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=0,
    )
    (only,) = answer.choices
    assert only.finish_reason == "tool_calls", only
    (call,) = only.message.tool_calls
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    _arguments_valid(call)


def test_streamed_tool_calls_through_the_openai_client(oai, client):
    common = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": [WEATHER, CLOCK],
        "tool_choice": "required",
        "max_tokens": 160,
        "temperature": 1.0,
        "seed": 0,  # a draw whose random-model arguments close within max_tokens
    }
    calls: dict[int, dict] = {}
    finish = None
    for chunk in oai.chat.completions.create(stream=True, **common):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and calls
    plain = oai.chat.completions.create(**common)
    assert [c.function.arguments for c in plain.choices[0].message.tool_calls] == [
        c["arguments"] for c in calls.values()
    ]  # seeded: the stream carries the same calls
    for call in plain.choices[0].message.tool_calls:
        _arguments_valid(call)
    raw = _events(client.post("/v1/chat/completions", json={**common, "stream": True}))
    for chunk in raw:
        assert_valid("CreateChatCompletionStreamResponse", chunk)
    assert_valid(
        "CreateChatCompletionResponse",
        client.post("/v1/chat/completions", json=common).json(),
    )


def test_tool_choice_none_and_auto_answer_in_text(oai):
    for choice in ("none", "auto"):
        answer = oai.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice=choice, max_tokens=8
        )
        assert answer.choices[0].message.tool_calls is None
        assert answer.choices[0].finish_reason in ("stop", "length")


def test_a_conversation_with_earlier_calls_and_tool_answers_is_accepted(oai):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "kyoto", "unit": "c"}'},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, rain"},
    ]
    answer = oai.chat.completions.create(
        model="tiny", messages=messages, tools=[WEATHER], max_tokens=4
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_end_to_end_through_the_serve_endpoint(endpoint):
    """THE end-to-end proof: the Ray Serve endpoint, the `openai` client over HTTP, a streamed
    forced tool call and a json_schema answer. The endpoint's tiny model has a 512-token context
    and a 64-token answer limit: the tool prompt is cut to its last 400 tokens (the grammar
    forces the call) and the tool takes no arguments, so the whole call fits."""
    with openai.OpenAI(base_url=endpoint.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        common = {"model": "tiny", "messages": MESSAGES, "max_tokens": 64, "temperature": 0}
        calls, finish = {}, None
        for chunk in c.chat.completions.create(
            stream=True,
            tools=[CLOCK],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
            extra_body={"truncate_prompt_tokens": 400},
            **common,
        ):
            finish = chunk.choices[0].finish_reason or finish
            for d in chunk.choices[0].delta.tool_calls or []:
                calls[d.index] = d.function
        assert finish == "tool_calls"
        assert [(f.name, json.loads(f.arguments)) for f in calls.values()] == [("get_time", {})]
        fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}}
        answer = c.chat.completions.create(response_format=fmt, **common)
        assert answer.choices[0].finish_reason == "stop"
        _valid(POINT, answer.choices[0].message.content)
