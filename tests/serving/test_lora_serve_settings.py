"""`kiln serve --lora NAME=PATH --max-loras N` and the serve stage's `lora:` reach the backend:
the command line's settings build a local backend serving the adapters; bad flags and a LoRA
setting a backend cannot honour are refused before anything starts; a deployed endpoint (Ray
Serve) answers an adapter's requests as its merged model."""

from __future__ import annotations

import asyncio

import pytest

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.lora import LoRAConfig
from kiln.platform.cli import build_parser
from kiln.platform.errors import ConfigError
from kiln.serving.app import AppSettings, make_backend
from kiln.serving.client import KilnClient
from kiln.serving.commands import serve_settings
from kiln.serving.launch import launch
from kiln.serving.stages import ServeConfig
from tests.conftest import free_port
from tests.engine.lora_fixtures import make_adapter
from tests.serving.rest.tiny_model import make_tiny_model


def settings_of(*argv: str) -> dict:
    return serve_settings(build_parser().parse_args(["serve", "model", *argv]))


def test_lora_flags_become_the_lora_settings():
    assert settings_of()["lora"] is None  # LoRA serving off
    assert settings_of("--max-loras", "2")["lora"] == {"adapters": {}, "max_loras": 2}
    lora = settings_of("--lora", "a=/x/a", "--lora", "b=/y=z", "--max-lora-rank", "32")["lora"]
    assert lora == {"adapters": {"a": "/x/a", "b": "/y=z"}, "max_lora_rank": 32}
    for bad, message in (("a", "NAME=PATH"), ("=/x", "NAME=PATH"), ("a=", "NAME=PATH")):
        with pytest.raises(ConfigError, match=message):
            settings_of("--lora", bad)
    with pytest.raises(ConfigError, match="'a' is named twice"):
        settings_of("--lora", "a=/x", "--lora", "a=/y")


def test_lora_settings_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="lora applies to the local backend"):
        AppSettings(backend="triton", triton_url="h:1", triton_model="m", lora={})
    with pytest.raises(ValueError, match="max_loras"):
        ServeConfig(lora={"max_loras": 0})
    assert ServeConfig(lora={"adapters": {"a": "/x"}}).lora.max_loras == 4


def test_the_command_lines_backend_serves_the_adapters(tmp_path):
    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    base = Generator.load(model_dir)
    make_adapter(base.model, LoRAConfig(rank=2, alpha=4), str(tmp_path / "a"), seed=1)
    argv = ["--lora", f"sql={tmp_path / 'a'}", "--max-loras", "1", "--model-name", "tiny"]
    backend = make_backend(AppSettings(model_dir=model_dir, **_app_fields(settings_of(*argv))))
    try:
        assert [a.name for a in backend.lora_adapters()] == ["sql"]
        assert backend.engine_stats()["lora_adapters_loaded"] == 1
    finally:
        asyncio.run(backend.close())
    with pytest.raises(Exception, match="lora_path: .*not a PEFT adapter folder"):
        make_backend(AppSettings(model_dir=model_dir, lora={"adapters": {"x": str(tmp_path)}}))


def _app_fields(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in ("api_key", "triton_url")}


@pytest.mark.slow
def test_serve_with_lora_answers_as_the_merged_adapter(ray_session, tmp_path):
    from ray import serve

    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    base = Generator.load(model_dir)
    merged = make_adapter(base.model, LoRAConfig(rank=4, alpha=8), str(tmp_path / "a"), seed=2)
    reference = Generator(merged, base.tokenizer, eos_token_ids=base.eos_token_ids)
    prompts = ["the quick brown fox", "kiln turns raw text"]
    greedy = SamplingParams(max_new_tokens=8)
    expected = [c.text for c in reference.generate(prompts, greedy)]
    argv = ["--lora", f"sql={tmp_path / 'a'}", "--num-cpus", "0.5"]
    settings = settings_of(*argv)
    endpoint = launch(model_dir, settings, port=free_port(), app_name="lora", route_prefix="/lora")
    try:
        with KilnClient(endpoint.url, model="sql") as client:
            served = [client.complete(p, max_tokens=8, temperature=0) for p in prompts]
    finally:
        endpoint.close()
        serve.shutdown()
    assert served == expected
