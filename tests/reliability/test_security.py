"""Security bounds: loopback by default, a warning when exposed without a key, API keys compared
in constant time and never logged, request size bounded, weights never unpickled, and truncated
weight files (safetensors, GGUF, DCP) rejected with one line."""

from __future__ import annotations

import ast
import inspect
import logging
import os
import shutil
from pathlib import Path

import pytest

from kiln.platform.errors import InputError

KILN = Path(__file__).resolve().parents[2] / "kiln"
KEY = "s3cret-key-for-tests"


# -- where servers listen ------------------------------------------------------------------------


def test_every_server_binds_loopback_unless_told_otherwise():
    import argparse

    from kiln.platform.runtime import Runtime
    from kiln.serving import app, cli
    from kiln.serving.launch import launch
    from kiln.serving.stages import ServeStage
    from kiln.serving.triton import server as triton_server

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m"]).host == "127.0.0.1"  # kiln serve (Ray Serve)
    assert ServeStage.Config.model_fields["host"].default == "127.0.0.1"  # pipelines
    for fn in (launch, app.start_http, triton_server.TritonServer.__init__):
        assert inspect.signature(fn).parameters["host"].default == "127.0.0.1", fn
    # the embedded Ray: node (and so GCS/raylet) on loopback, no dashboard unless asked
    source = inspect.getsource(Runtime.ensure)
    assert '_node_ip_address="127.0.0.1"' in source and "include_dashboard=self.dashboard" in source
    assert Runtime().dashboard is False
    # no default anywhere in kiln binds every interface
    for path in KILN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arguments):
                for default in node.defaults + node.kw_defaults:
                    assert not (isinstance(default, ast.Constant) and default.value == "0.0.0.0"), (
                        path
                    )


def test_exposed_without_key_warns_in_one_line():
    from kiln.serving.exposure import public_bind_warning

    warning = public_bind_warning("0.0.0.0", None)
    assert warning and "\n" not in warning and "without an API key" in warning
    assert public_bind_warning("0.0.0.0", KEY) is None
    assert public_bind_warning("127.0.0.1", None) is None
    assert public_bind_warning("::1", None) is None


# -- the REST app: keys and bounds -------------------------------------------------------------


@pytest.fixture(scope="module")
def rest(tmp_path_factory):
    from fastapi.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend
    from tests.serving.rest.tiny_model import make_tiny_model

    model = make_tiny_model(str(tmp_path_factory.mktemp("sec") / "tiny"))
    backend = LocalBackend(model, "tiny", BatchingConfig(max_batch_size=1))
    limits = Limits(max_new_tokens=8, max_prompt_chars=200, max_body_bytes=4096)
    with TestClient(create_api(backend, limits, api_key=KEY)) as client:
        yield client


def _complete(client, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.post("/v1/completions", json=body, headers=headers, **kw)


def test_api_key_checked_in_constant_time_and_never_logged(rest, caplog):
    from kiln.serving.api.server import ApiKeyMiddleware

    assert "hmac.compare_digest" in inspect.getsource(ApiKeyMiddleware)
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
    with caplog.at_level(logging.DEBUG):
        assert _complete(rest, body, key=None).status_code == 401
        assert _complete(rest, body, key=KEY + "x").status_code == 401
        assert _complete(rest, body, key=KEY[:-1]).status_code == 401
        ok = _complete(rest, body)
    assert ok.status_code == 200, ok.text
    assert KEY[:-1] not in caplog.text  # neither the key nor what was tried is in any log line


def test_request_size_prompt_length_and_max_tokens_are_bounded(rest):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    big = _complete(rest, {**body, "prompt": "x" * 5000})  # body over max_body_bytes
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b"x" * 1000

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    chunked = rest.post("/v1/completions", content=chunks(), headers=headers)
    assert chunked.status_code == 413
    long_prompt = _complete(rest, {**body, "prompt": "y" * 300})
    assert long_prompt.status_code == 400 and "at most 200" in long_prompt.text
    too_many = _complete(rest, {**body, "max_tokens": 9})
    assert too_many.status_code == 400 and "max_tokens" in too_many.text
    assert _complete(rest, body).status_code == 200


# -- weights: never unpickled, a truncated file is one line ---------------------------------------


def test_weight_loading_never_unpickles():
    for path in KILN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            base = node.func.value
            if isinstance(base, ast.Name) and (base.id, node.func.attr) == ("torch", "load"):
                kw = {k.arg: k.value for k in node.keywords}
                assert (
                    isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value
                ), f"{path}:{node.lineno}: torch.load without weights_only=True"


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_truncated_safetensors_is_one_line(tmp_path):
    from kiln.model.formats.weights import read_weights
    from tests.serving.rest.tiny_model import make_tiny_model

    model = make_tiny_model(str(tmp_path / "tiny"))
    weights = os.path.join(model, "model.safetensors")
    for size in (os.path.getsize(weights) // 2, 3):
        _truncate(weights, size)
        with pytest.raises(InputError) as err:
            read_weights(model)
        assert "\n" not in str(err.value) and "model.safetensors" in str(err.value)


def test_truncated_gguf_is_one_line(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    from kiln.model.formats.gguf import read_gguf

    path = str(tmp_path / "m.gguf")
    writer = GGUFWriter(path, "llama")
    for key, value in {
        "block_count": 1,
        "attention.head_count": 2,
        "embedding_length": 8,
        "feed_forward_length": 16,
        "context_length": 32,
        "vocab_size": 16,
    }.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("token_embd.weight", np.ones((16, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    full = os.path.getsize(path)
    for size in (full - 64, 40):  # inside the tensor data; inside the header
        shutil.copy(path, path + ".cut")
        _truncate(path + ".cut", size)
        with pytest.raises(InputError) as err:
            read_gguf(path + ".cut")
        assert "\n" not in str(err.value) and "truncated" in str(err.value), err.value


def test_truncated_dcp_shard_is_one_line(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    from kiln.model.formats import storage
    from kiln.model.formats.checkpoint import load_model_state

    ckpt = str(tmp_path / "step-00000001")
    with pytest.warns(UserWarning):  # one process, no process group: intended
        dcp.save({"model": {"w": torch.ones(64, 64)}}, checkpoint_id=ckpt)
    storage.write_json(os.path.join(ckpt, storage.SIDECAR), {"step": 1, "model": {}})
    (shard,) = [f for f in os.listdir(ckpt) if f.endswith(".distcp")]
    _truncate(os.path.join(ckpt, shard), 100)
    with pytest.raises(InputError) as err:
        load_model_state(ckpt)
    assert "\n" not in str(err.value) and "unreadable checkpoint" in str(err.value), err.value
