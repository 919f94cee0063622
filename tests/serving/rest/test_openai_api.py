"""The OpenAI surface clients and eval harnesses use, through the `openai` client against the
Serve endpoint: chat completions (streaming too), logprobs, echo + logprobs (log-likelihoods
equal `transformers`' on the HF export), n / best_of, token-id prompts, GET /v1/models/{id},
and KServe's model config through `tritonclient`."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.serving.rest.conftest import API_KEY


@pytest.fixture
def client(endpoint):
    import openai

    with openai.OpenAI(base_url=endpoint.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def hf_logprobs(hf_model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from transformers."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def chatml(messages) -> str:
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


MESSAGES = [
    {"role": "system", "content": "You are a kiln."},
    {"role": "user", "content": "the quick brown fox"},
]


def test_chat_completion_renders_chatml_and_equals_in_process(client, generator, endpoint):
    from kiln.engine.sampler import SamplingParams
    from kiln.serving.client import KilnClient

    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10, temperature=0
    )
    params = SamplingParams(max_new_tokens=10, stop=["<|im_end|>"])
    expected = generator.generate([chatml(MESSAGES)], params)[0]
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected.text
    assert r.usage.prompt_tokens == expected.prompt_tokens
    assert r.usage.completion_tokens == expected.completion_tokens
    with KilnClient(endpoint.url, api_key=API_KEY) as kiln_client:
        assert kiln_client.chat(MESSAGES, max_tokens=10, temperature=0) == expected.text

    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_logprobs_and_n(client, hf_model):
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0.9,
        seed=3,
        n=3,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # copies sample differently
    for choice in r.choices:
        content = choice.logprobs.content
        raw = b"".join(bytes(t.bytes) for t in content)
        assert raw.decode("utf-8", errors="replace") == choice.message.content
        for t in content:
            assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob - 1e-9


def test_completion_logprobs_of_sampled_tokens(client):
    r = client.completions.create(
        model="tiny", prompt="a kiln fires clay", max_tokens=6, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value == pytest.approx(max(top.values()))  # greedy: the chosen one is the best
        assert token in top and len(top) <= 3


def test_echo_logprobs_equal_transformers(client, generator, hf_model):
    """lm-evaluation-harness's `local-completions` log-likelihood request: token-id prompts,
    echo, logprobs=1, max_tokens=1; it reads token_logprobs[ctxlen:-1]."""
    context = generator.encode("the quick brown fox")
    continuations = [generator.encode(" jumps over"), generator.encode(" kiln fires clay")]
    prompts = [context + c for c in continuations]
    r = client.completions.create(
        model="tiny", prompt=prompts, max_tokens=1, temperature=0, echo=True, logprobs=1, seed=1
    )
    for choice, ids in zip(r.choices, prompts, strict=True):
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 1
        expected = hf_logprobs(hf_model, ids)
        got = lp.token_logprobs[1 : len(ids)]
        assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 1e-4
        ctxlen = len(context)
        loglikelihood = sum(lp.token_logprobs[ctxlen:-1])
        assert loglikelihood == pytest.approx(sum(expected[ctxlen - 1 :]), abs=1e-4)
        is_greedy = all(
            t == max(top.values())
            for t, top in zip(lp.token_logprobs[ctxlen:-1], lp.top_logprobs[ctxlen:-1], strict=True)
        )
        assert isinstance(is_greedy, bool)


def test_token_id_prompt_equals_text_prompt(client, generator):
    text = client.completions.create(model="tiny", prompt="serving", max_tokens=6, temperature=0)
    ids = client.completions.create(
        model="tiny", prompt=generator.encode("serving"), max_tokens=6, temperature=0
    )
    assert ids.choices[0].text == text.choices[0].text
    assert ids.usage == text.usage


def test_best_of_keeps_the_most_likely(client):
    kw = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 1.0, "seed": 5}
    best = client.completions.create(best_of=4, n=1, logprobs=0, **kw).choices[0]
    all4 = client.completions.create(n=4, logprobs=0, **kw).choices
    scores = {c.text: sum(c.logprobs.token_logprobs) for c in all4}
    assert best.text == max(scores, key=scores.get)


def test_unsupported_fields_are_400(client, endpoint):
    import openai

    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model="tiny", prompt="x", suffix="y")
    with pytest.raises(openai.BadRequestError, match="functions"):  # the legacy form of tools
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            extra_body={"functions": [{"name": "f", "parameters": {}}]},
        )
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model="tiny", prompt="x", logit_bias={"5": 10})


def test_models_by_id(client):
    import openai

    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_tritonclient_model_config(endpoint):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(endpoint.url.removeprefix("http://"))
    try:
        config = c.get_model_config("tiny", headers={"Authorization": f"Bearer {API_KEY}"})
    finally:
        c.close()
    assert config["name"] == "tiny"
    assert {t["name"]: t["data_type"] for t in config["input"]}["text_input"] == "TYPE_STRING"
    assert [t["name"] for t in config["output"]] == ["text_output"]
    r = httpx.get(
        endpoint.url + "/v2/models/nope/config", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert r.status_code == 404 and set(r.json()) == {"error"}
