"""`kiln serve --speculative ngram` / `--speculative-model PATH`: the command line's settings
reach the engine, greedy answers (plain and streamed) are the model's own, and /metrics carries
vLLM's spec-decode counters; bad combinations are refused with the flag's name."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.platform.cli import build_parser
from kiln.platform.errors import InputError
from kiln.serving.app import AppSettings
from kiln.serving.commands import serve_settings

# repetitive text (a table, a list): prompt lookup finds its n-grams
PROMPTS = [
    "the quick brown fox, the quick brown fox, the quick brown fox, the quick",
    "hello world hello world hello world hello world hello",
]


def metric_samples(client) -> dict[tuple[str, str | None], float]:
    text = client.get("/metrics").text
    return {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_endpoint_answers_as_the_model_and_counts(tiny_model_dir, method):
    from starlette.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.local import LocalBackend

    # the served model drafts for itself: a draft that agrees with it, so drafts are accepted
    flags = ["--speculative", "ngram"] if method == "ngram" else ["--speculative-model"]
    flags += [] if method == "ngram" else [tiny_model_dir]
    argv = ["serve", tiny_model_dir, *flags, "--num-speculative-tokens", "3"]
    settings = AppSettings.model_validate(
        {**serve_settings(build_parser().parse_args(argv)), "model_dir": tiny_model_dir}
    )
    assert settings.batching.speculative.method == method
    assert settings.batching.speculative.num_speculative_tokens == 3
    expected = [
        c.text
        for c in Generator.load(tiny_model_dir).generate(PROMPTS, SamplingParams(max_new_tokens=24))
    ]
    backend = LocalBackend(tiny_model_dir, "tiny", settings.batching)
    with TestClient(create_api(backend, Limits())) as client:
        texts, streamed = [], []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
                assert s.status_code == 200
                streamed.append("".join(_deltas(s.iter_lines())))
        samples = metric_samples(client)
    asyncio.run(backend.close())
    assert texts == expected and streamed == expected
    drafts = samples[("vllm:spec_decode_num_drafts_total", None)]
    drafted = samples[("vllm:spec_decode_num_draft_tokens_total", None)]
    accepted = samples[("vllm:spec_decode_num_accepted_tokens_total", None)]
    assert 0 < accepted <= drafted and drafts > 0
    per_pos = [
        samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))] for i in range(3)
    ]
    assert sum(per_pos) == accepted


def _deltas(lines):
    import json

    for line in lines:
        if line.startswith("data: {"):
            yield json.loads(line[len("data: ") :])["choices"][0]["text"]


def test_speculative_flags_refused_with_their_names():
    parse = build_parser().parse_args
    assert serve_settings(parse(["serve", "m"]))["batching"]["speculative"] is None
    with pytest.raises(InputError, match="--num-speculative-tokens: needs --speculative"):
        serve_settings(parse(["serve", "m", "--num-speculative-tokens", "3"]))
    with pytest.raises(InputError, match="--speculative-disable-by-batch-size: needs"):
        serve_settings(parse(["serve", "m", "--speculative-disable-by-batch-size", "4"]))
    on = serve_settings(
        parse(["serve", "m", "--speculative", "ngram", "--speculative-disable-by-batch-size", "4"])
    )
    assert on["batching"]["speculative"]["disable_by_batch_size"] == 4
    bad = serve_settings(parse(["serve", "m", "--speculative", "draft_model"]))
    with pytest.raises(ValueError, match="speculative.model"):
        AppSettings.model_validate({**bad, "model_dir": "m"})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        AppSettings.model_validate(
            {
                **serve_settings(
                    parse(["serve", "m", "--speculative", "ngram", "--num-speculative-tokens", "0"])
                ),
                "model_dir": "m",
            }
        )
