"""One tiny model and one endpoint (local backend, API key) shared by the REST tests."""

from __future__ import annotations

import pytest

from tests.conftest import free_port
from tests.serving.rest.tiny_model import make_tiny_model

API_KEY = "test-key"
MAX_NEW_TOKENS = 64
# autoscaling the shared endpoint is deployed with (test_autoscaling.py reads it back from Serve);
# the long upscale delay keeps it at one replica for the tests' duration
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 32,
    "upscale_delay_s": 3600,
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("rest") / "tiny"))


@pytest.fixture(scope="session")
def generator(tiny_model_dir):
    """The same model in-process: the reference the endpoint must agree with."""
    from kiln.engine.generator import Generator

    return Generator.load(tiny_model_dir)


@pytest.fixture(scope="package")
def endpoint(ray_session, tiny_model_dir):
    from ray import serve

    from kiln.serving.launch import launch

    settings = {
        "api_key": API_KEY,
        "limits": {"max_new_tokens": MAX_NEW_TOKENS, "max_prompt_chars": 2000},
        "batching": {"max_batch_size": 16},
        "deployment": {"num_cpus": 0.5, "autoscaling": AUTOSCALING},
    }
    # under a route prefix of its own: no clash with an app another test left at "/"
    ep = launch(
        tiny_model_dir, settings, port=free_port(), app_name="rest-test", route_prefix="/rest"
    )
    yield ep
    ep.close()
    serve.shutdown()


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="session")
def local_backend(tiny_model_dir):
    """The local backend in this process (no Ray): for in-process app tests."""
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend

    return LocalBackend(tiny_model_dir, "tiny", BatchingConfig(max_batch_size=16))


@pytest.fixture(scope="session")
def app(local_backend):
    """The REST app over the local backend, in-process, with small limits (fast to fuzz)."""
    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api

    return create_api(local_backend, Limits(max_new_tokens=16, max_prompt_chars=2000))


@pytest.fixture(scope="session")
def api_client(app):
    """starlette's TestClient over the in-process app, on one event loop for the session."""
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        yield client
