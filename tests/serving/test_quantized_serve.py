"""`kiln serve --quantize` and `--dtype bf16`: the command line's settings deploy an endpoint whose
greedy answers are the int8 (bf16) model's, loaded in this process, and settings a backend
cannot honour are refused before anything is deployed."""

from __future__ import annotations

import pytest
import torch

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.cpu_linear import PackedBf16Linear, cpu_has_bf16_matmul
from kiln.platform.cli import build_parser
from kiln.platform.errors import ConfigError
from kiln.serving.app import AppSettings
from kiln.serving.client import KilnClient
from kiln.serving.commands import serve_settings
from kiln.serving.launch import launch
from tests.conftest import free_port
from tests.serving.rest.tiny_model import make_tiny_model

PROMPTS = ["the quick brown fox", "kiln turns raw text", "hello world, this is"]


@pytest.mark.slow
def test_serve_quantize_int8_answers_as_the_int8_model(ray_session, tmp_path):
    from ray import serve

    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    argv = ["serve", model_dir, "--quantize", "int8", "--num-cpus", "0.5"]
    settings = serve_settings(build_parser().parse_args(argv))
    assert settings["quantize"] == "int8"
    int8 = Generator.load(model_dir, quantize="int8")
    fp32 = Generator.load(model_dir)
    greedy = SamplingParams(max_new_tokens=12)
    # one prompt at a time, as the client sends them: on CPUs with bf16 units an int8 matmul of
    # 1-2 rows runs the weight-only kernel and a larger one the packed bf16 copy, so a batch of
    # four decodes with other roundings than one request alone
    expected = [int8.generate([p], greedy)[0].text for p in PROMPTS]
    float_texts = [c.text for c in fp32.generate(PROMPTS, greedy)]
    endpoint = launch(model_dir, settings, port=free_port(), app_name="q8", route_prefix="/q8")
    try:
        with KilnClient(endpoint.url) as client:
            served = [client.complete(p, max_tokens=12, temperature=0) for p in PROMPTS]
    finally:
        endpoint.close()
        serve.shutdown()
    same = sum(a == b for a, b in zip(expected, float_texts, strict=True))
    print(f"int8 greedy completions equal to fp32's: {same}/{len(PROMPTS)}")
    assert served == expected


@pytest.mark.slow
def test_serve_dtype_bf16_answers_as_the_bf16_model(ray_session, tmp_path):
    from ray import serve

    model_dir = make_tiny_model(str(tmp_path / "tiny"))
    argv = ["serve", model_dir, "--dtype", "bf16", "--num-cpus", "0.5"]
    settings = serve_settings(build_parser().parse_args(argv))
    bf16 = Generator.load(model_dir, dtype=torch.bfloat16)  # packed where the CPU has bf16 units
    assert isinstance(bf16.model.output, PackedBf16Linear) == cpu_has_bf16_matmul()
    expected = [c.text for c in bf16.generate(PROMPTS, SamplingParams(max_new_tokens=12))]
    endpoint = launch(model_dir, settings, port=free_port(), app_name="bf", route_prefix="/bf")
    try:
        with KilnClient(endpoint.url) as client:
            served = [client.complete(p, max_tokens=12, temperature=0) for p in PROMPTS]
    finally:
        endpoint.close()
        serve.shutdown()
    assert served == expected


def test_quantize_a_backend_cannot_honour_is_refused_before_deploying():
    triton = {"backend": "triton", "triton_url": "127.0.0.1:1", "triton_model": "m"}
    with pytest.raises(ConfigError, match="serve: .*quantize applies to the local backend"):
        launch(None, {**triton, "quantize": "int8"})
    with pytest.raises(ConfigError, match="quantize fp8 runs on a GPU"):
        launch(None, {"model_dir": "unused", "quantize": "fp8"})
    fp8 = serve_settings(
        build_parser().parse_args(["serve", "m", "--quantize", "fp8", "--num-gpus", "1"])
    )
    assert AppSettings.model_validate({**fp8, "model_dir": "m"}).deployment.num_gpus == 1
    with pytest.raises(SystemExit):  # argparse: not a group size the kernels take
        build_parser().parse_args(
            ["serve", "m", "--quantize", "int4", "--quantize-group-size", "48"]
        )


def test_serve_dtype_reaches_the_settings_and_triton_refuses_it():
    for flag, dtype in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp32", "float32")):
        settings = serve_settings(build_parser().parse_args(["serve", "m", "--dtype", flag]))
        assert settings["dtype"] == dtype
        assert AppSettings.model_validate({**settings, "model_dir": "m"}).dtype == dtype
    assert serve_settings(build_parser().parse_args(["serve", "m"]))["dtype"] == "float32"
    triton = {"backend": "triton", "triton_url": "127.0.0.1:1", "triton_model": "m"}
    with pytest.raises(ConfigError, match="serve: .*dtype applies to the local backend"):
        launch(None, {**triton, "dtype": "bfloat16"})
    with pytest.raises(SystemExit):  # argparse: not a dtype the local backend serves
        build_parser().parse_args(["serve", "m", "--dtype", "float16"])


def test_cpu_compile_is_on_by_default_and_reaches_the_settings():
    for argv, expected in ((["serve", "m"], True), (["serve", "m", "--no-cpu-compile"], False)):
        settings = serve_settings(build_parser().parse_args(argv))
        assert settings["cpu_compile"] is expected
        assert AppSettings.model_validate({**settings, "model_dir": "m"}).cpu_compile is expected
