"""The `openai` Python client against /v1/completions and /v1/models."""

from __future__ import annotations

import pytest

from tests.serving.rest.conftest import API_KEY

PROMPTS = ["the quick brown fox", "a kiln fires clay", "serving"]


@pytest.fixture
def client(endpoint):
    import openai

    with openai.OpenAI(base_url=endpoint.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def greedy(generator, prompt: str, n: int) -> str:
    from kiln.engine.sampler import SamplingParams

    return generator.generate([prompt], SamplingParams(max_new_tokens=n))[0].text


def test_models_lists_the_served_model(client, endpoint):
    assert [m.id for m in client.models.list().data] == [endpoint.model_name] == ["tiny"]


def test_completion_equals_in_process_greedy(client, generator):
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].text == greedy(generator, PROMPTS[0], 12)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_list_of_prompts_is_one_choice_each(client, generator):
    r = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [greedy(generator, p, 8) for p in PROMPTS]


def test_streaming_joins_to_the_same_text(client, generator):
    chunks = list(
        client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=10, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].text for c in chunks)
    assert text == greedy(generator, PROMPTS[1], 10)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_seeded_sampling_repeats(client):
    kw = {
        "model": "tiny",
        "prompt": PROMPTS[2],
        "max_tokens": 10,
        "temperature": 0.9,
        "top_p": 0.9,
        "seed": 7,
    }
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_stop_string_cuts_the_text(client, generator):
    full = greedy(generator, PROMPTS[0], 16)
    # any whole character after the first (the random model emits many partial-UTF-8 bytes)
    stop = next((ch for ch in full[1:] if ch != "\ufffd" and ch.isprintable()), None)
    if stop is None:
        pytest.skip("the random model produced no printable character to stop at")
    r = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop]
    )
    assert stop not in r.choices[0].text and len(r.choices[0].text) < len(full)
    assert r.choices[0].finish_reason == "stop"


def test_kiln_client_and_cli(endpoint, generator, capsys):
    from kiln.platform.cli import main
    from kiln.serving.client import KilnClient

    with KilnClient(endpoint.url, api_key=API_KEY) as c:
        assert c.health()
        assert c.models() == ["tiny"]
        text = c.complete(PROMPTS[0], max_tokens=6, temperature=0)
        assert text == greedy(generator, PROMPTS[0], 6)
        assert "".join(c.stream(PROMPTS[0], max_tokens=6, temperature=0)) == text
    assert (
        main(
            [
                "generate",
                "--url",
                endpoint.url,
                "--api-key",
                API_KEY,
                "--max-tokens",
                "6",
                PROMPTS[0],
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == text + "\n"
    assert main(["generate", "--url", endpoint.url, "--api-key", "wrong", PROMPTS[0]]) == 2
    assert "HTTP 401" in capsys.readouterr().err
