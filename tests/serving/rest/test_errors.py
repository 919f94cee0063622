"""Malformed requests each get the right 4xx and a JSON error in the protocol's format."""

from __future__ import annotations

import httpx
import pytest

from kiln.serving.api.protocol import ERROR_CODES
from tests.serving.rest.conftest import API_KEY, MAX_NEW_TOKENS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
JSON = {"Content-Type": "application/json"}
TEXT = {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}

# (method, path, body (dict -> JSON, bytes -> raw), headers, status)
OPENAI_CASES = {
    "bad json": ("post", "/v1/completions", b'{"prompt": "x",', AUTH, 400),
    "not an object": ("post", "/v1/completions", b"[1, 2]", AUTH, 400),
    "missing prompt": ("post", "/v1/completions", {"max_tokens": 4}, AUTH, 400),
    "prompt wrong type": ("post", "/v1/completions", {"prompt": 42}, AUTH, 400),
    "max_tokens wrong type": (
        "post",
        "/v1/completions",
        {"prompt": "x", "max_tokens": "ten"},
        AUTH,
        400,
    ),
    "max_tokens negative": (
        "post",
        "/v1/completions",
        {"prompt": "x", "max_tokens": -5},
        AUTH,
        400,
    ),
    "max_tokens zero": ("post", "/v1/completions", {"prompt": "x", "max_tokens": 0}, AUTH, 400),
    "max_tokens huge": (
        "post",
        "/v1/completions",
        {"prompt": "x", "max_tokens": 10**12},
        AUTH,
        400,
    ),
    "max_tokens over limit": (
        "post",
        "/v1/completions",
        {"prompt": "x", "max_tokens": MAX_NEW_TOKENS + 1},
        AUTH,
        400,
    ),
    "temperature negative": (
        "post",
        "/v1/completions",
        {"prompt": "x", "temperature": -1},
        AUTH,
        400,
    ),
    "top_p zero": ("post", "/v1/completions", {"prompt": "x", "top_p": 0}, AUTH, 400),
    "stream not bool": ("post", "/v1/completions", {"prompt": "x", "stream": "yes"}, AUTH, 400),
    "n too large": ("post", "/v1/completions", {"prompt": "x", "n": 17}, AUTH, 400),
    "prompt too long": ("post", "/v1/completions", {"prompt": "x" * 5000}, AUTH, 400),
    "unknown model": ("post", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, AUTH, 404),
    "missing key": ("post", "/v1/completions", {"prompt": "x"}, {}, 401),
    "wrong key": (
        "post",
        "/v1/completions",
        {"prompt": "x"},
        {"Authorization": "Bearer nope"},
        401,
    ),
    "not bearer": (
        "post",
        "/v1/completions",
        {"prompt": "x"},
        {"Authorization": f"Basic {API_KEY}"},
        401,
    ),
    "bad json without key": ("post", "/v1/completions", b"{", {}, 401),
    "models without key": ("get", "/v1/models", None, {}, 401),
    "unknown route": ("get", "/v1/nothing", None, AUTH, 404),
    "wrong method": ("get", "/v1/completions", None, AUTH, 405),
}
KSERVE_CASES = {
    "bad json": ("post", "/v2/models/tiny/infer", b"{nope", AUTH, 400),
    "inputs missing": ("post", "/v2/models/tiny/infer", {"id": "1"}, AUTH, 400),
    "inputs wrong type": ("post", "/v2/models/tiny/infer", {"inputs": "text"}, AUTH, 400),
    "text_input missing": ("post", "/v2/models/tiny/infer", {"inputs": []}, AUTH, 400),
    "unknown input": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT, {**TEXT, "name": "foo"}]},
        AUTH,
        400,
    ),
    "text_input not BYTES": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [{**TEXT, "datatype": "INT32", "data": [1]}]},
        AUTH,
        400,
    ),
    "shape mismatch": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [{**TEXT, "shape": [3]}]},
        AUTH,
        400,
    ),
    "data missing": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [{k: v for k, v in TEXT.items() if k != "data"}]},
        AUTH,
        400,
    ),
    "max_tokens negative": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT, {"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [-1]}]},
        AUTH,
        400,
    ),
    "max_tokens huge param": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT], "parameters": {"max_tokens": 10**9}},
        AUTH,
        400,
    ),
    "max_tokens wrong type param": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT], "parameters": {"max_tokens": "x"}},
        AUTH,
        400,
    ),
    "sampling_parameters not json": (
        "post",
        "/v2/models/tiny/infer",
        {
            "inputs": [
                TEXT,
                {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES", "data": ["{"]},
            ]
        },
        AUTH,
        400,
    ),
    "binary size beyond body": (
        "post",
        "/v2/models/tiny/infer",
        {
            "inputs": [
                {
                    **{k: v for k, v in TEXT.items() if k != "data"},
                    "parameters": {"binary_data_size": 99},
                }
            ]
        },
        AUTH,
        400,
    ),
    "unknown output": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT], "outputs": [{"name": "logits"}]},
        AUTH,
        400,
    ),
    "unknown model infer": ("post", "/v2/models/nope/infer", {"inputs": [TEXT]}, AUTH, 404),
    "unknown model metadata": ("get", "/v2/models/nope", None, AUTH, 404),
    "unknown model ready": ("get", "/v2/models/nope/ready", None, AUTH, 404),
    "infer without key": ("post", "/v2/models/tiny/infer", {"inputs": [TEXT]}, {}, 401),
    "infer wrong key": (
        "post",
        "/v2/models/tiny/infer",
        {"inputs": [TEXT]},
        {"Authorization": "Bearer x"},
        401,
    ),
    "generate text missing": ("post", "/v2/models/tiny/generate", {"max_tokens": 3}, AUTH, 400),
    "generate bad json": ("post", "/v2/models/tiny/generate", b"nope", AUTH, 400),
    "generate huge max_tokens": (
        "post",
        "/v2/models/tiny/generate",
        {"text_input": "x", "max_tokens": 10**6},
        AUTH,
        400,
    ),
    "generate negative max_tokens": (
        "post",
        "/v2/models/tiny/generate",
        {"text_input": "x", "parameters": {"max_tokens": -3}},
        AUTH,
        400,
    ),
    "generate unknown model": ("post", "/v2/models/nope/generate", {"text_input": "x"}, AUTH, 404),
}


def _send(url: str, case):
    method, path, body, headers, _ = case
    kwargs = {"headers": dict(headers)}
    if isinstance(body, bytes):
        kwargs.update(content=body)
        kwargs["headers"].update(JSON)
    elif body is not None:
        kwargs["json"] = body
    return httpx.request(method.upper(), url + path, timeout=60, **kwargs)


@pytest.mark.parametrize("case", OPENAI_CASES.values(), ids=OPENAI_CASES.keys())
def test_openai_errors(endpoint, case):
    r = _send(endpoint.url, case)
    assert r.status_code == case[-1], r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] == ERROR_CODES[case[-1]] and err["type"]  # a string, as OpenAI's


@pytest.mark.parametrize("case", KSERVE_CASES.values(), ids=KSERVE_CASES.keys())
def test_kserve_errors(endpoint, case):
    r = _send(endpoint.url, case)
    assert r.status_code == case[-1], r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]


def test_health_needs_no_key(endpoint):
    assert httpx.get(endpoint.url + "/v2/health/live").status_code == 200
    assert httpx.get(endpoint.url + "/v2/health/ready").status_code == 200


def test_error_message_names_the_field(endpoint):
    r = _send(endpoint.url, OPENAI_CASES["max_tokens over limit"])
    assert r.json()["error"]["param"] == "max_tokens"
    assert f"at most {MAX_NEW_TOKENS}" in r.json()["error"]["message"]
