"""`tritonclient.http` against the KServe v2 routes, and Triton's generate extension."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.serving.rest.conftest import API_KEY


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}  # fresh each call: tritonclient adds to it


@pytest.fixture
def triton(endpoint):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(endpoint.url.removeprefix("http://"))
    yield c
    c.close()


def greedy(generator, prompts, n):
    from kiln.engine.sampler import SamplingParams

    return [c.text for c in generator.generate(prompts, SamplingParams(max_new_tokens=n))]


def bytes_input(name, values, shape=None):
    import tritonclient.http as httpclient

    arr = np.array([v.encode() for v in values], dtype=np.object_).reshape(shape or [len(values)])
    t = httpclient.InferInput(name, list(arr.shape), "BYTES")
    t.set_data_from_numpy(arr)
    return t


def scalar_input(name, value, datatype, dtype):
    import tritonclient.http as httpclient

    t = httpclient.InferInput(name, [1], datatype)
    t.set_data_from_numpy(np.array([value], dtype=dtype))
    return t


def test_health_and_metadata(triton, endpoint):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny", headers=auth())
    meta = triton.get_model_metadata("tiny", headers=auth())
    assert meta["name"] == "tiny"
    assert {"text_input", "max_tokens", "temperature"} <= {t["name"] for t in meta["inputs"]}
    assert [t["name"] for t in meta["outputs"]] == ["text_output"]
    assert triton.get_server_metadata(headers=auth())["name"] == "kiln"


@pytest.mark.parametrize("binary", [True, False])
def test_infer_equals_in_process_greedy(triton, generator, binary):
    import tritonclient.http as httpclient

    prompts = ["the quick brown fox", "ray serve batches"]
    inputs = [
        bytes_input("text_input", prompts, [2, 1]),
        scalar_input("max_tokens", 8, "INT32", np.int32),
    ]
    outputs = [httpclient.InferRequestedOutput("text_output", binary_data=binary)]
    result = triton.infer("tiny", inputs, outputs=outputs, headers=auth(), request_id="r1")
    text = result.as_numpy("text_output")
    assert text.shape == (2, 1)
    assert [t.decode() if isinstance(t, bytes) else t for t in text.reshape(-1)] == greedy(
        generator, prompts, 8
    )
    assert result.get_response()["id"] == "r1"


def test_infer_with_sampling_parameters_json(triton, generator):
    params = json.dumps({"max_tokens": 5, "temperature": 0})
    inputs = [bytes_input("text_input", ["serving"]), bytes_input("sampling_parameters", [params])]
    result = triton.infer("tiny", inputs, headers=auth())  # no outputs named: binary by default
    assert result.as_numpy("text_output")[0].decode() == greedy(generator, ["serving"], 5)[0]


def test_triton_client_sees_errors(triton):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="not found"):
        triton.infer("nope", [bytes_input("text_input", ["x"])], headers=auth())
    with pytest.raises(InferenceServerException, match="401|API key"):
        triton.infer("tiny", [bytes_input("text_input", ["x"])])
    with pytest.raises(InferenceServerException, match="max_tokens"):
        triton.infer(
            "tiny",
            [
                bytes_input("text_input", ["x"]),
                scalar_input("max_tokens", 10**6, "INT32", np.int32),
            ],
            headers=auth(),
        )


def test_generate_and_generate_stream(endpoint, generator):
    expected = greedy(generator, ["a kiln"], 7)[0]
    r = httpx.post(
        f"{endpoint.url}/v2/models/tiny/generate",
        json={"text_input": "a kiln", "parameters": {"max_tokens": 7, "temperature": 0}},
        headers=auth(),
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"model_name": "tiny", "model_version": "1", "text_output": expected}
    r = httpx.post(
        f"{endpoint.url}/v2/models/tiny/generate",
        json={"text_input": "a kiln", "max_tokens": 7},
        headers=auth(),
    )
    assert r.json()["text_output"] == expected
    with httpx.stream(
        "POST",
        f"{endpoint.url}/v2/models/tiny/generate_stream",
        json={"text_input": "a kiln", "max_tokens": 7},
        headers=auth(),
    ) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == expected
