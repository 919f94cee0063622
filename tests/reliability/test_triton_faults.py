"""The REST deployment on the triton backend under bounded concurrent load; the tritonserver
kiln started is SIGKILLed mid-load. Kiln restarts it on the same ports within 30 s; meanwhile the
REST layer answers 503 + Retry-After (never 500), so clients retrying per KilnClient's policy
see no 5xx and every answer equals kiln's own greedy text."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import free_port

REQUESTS = 48
CONCURRENCY = 6
MAX_TOKENS = 6
APP = "reliability-triton-faults"


def test_triton_down_is_503_with_retry_after():
    """No server on the Triton port: each protocol's route answers 503 + Retry-After, not 500."""
    pytest.importorskip("tritonclient.grpc")
    from fastapi.testclient import TestClient

    from kiln.serving.backend_triton import TritonBackend
    from kiln.serving.protocol import Limits
    from kiln.serving.rest_api import create_api

    backend = TritonBackend(f"127.0.0.1:{free_port()}", "tiny")
    with TestClient(create_api(backend, Limits())) as client:
        for path, body in (
            ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
            (
                "/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            ),
            ("/v2/models/tiny/generate", {"text_input": "hi", "max_tokens": 2}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["retry-after"] == "1"
            assert "unavailable" in r.text


def test_supervisor_restarts_with_backoff_then_gives_up(tmp_path):
    """A server that keeps dying is restarted `max_restarts` times (0.5 s, 1 s apart), then the
    supervisor gives up with an error line and `wait()` returns the exit code."""
    from kiln.serving.triton_server import TritonServer

    class Dying(TritonServer):  # a process that exits 0.3 s after start, not a tritonserver
        def _prepare(self):
            self._workdir = tempfile.mkdtemp(dir=tmp_path)
            return [sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"], None

        def _wait_ready(self):
            pass

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("kiln.triton").addHandler(handler)
    server = Dying(str(tmp_path), restart=True, max_restarts=2)
    try:
        server.start()
        assert server.wait() == 3  # returns once the supervisor gives up
    finally:
        logging.getLogger("kiln.triton").removeHandler(handler)
        server.stop()
    lines = [r.getMessage() for r in records]
    assert server.restarts == 2
    assert sum("exited with code 3; restarting in 0.5 s" in m for m in lines) == 1
    assert sum("exited with code 3; restarting in 1.0 s" in m for m in lines) == 1
    assert "giving up" in lines[-1] and records[-1].levelno == logging.ERROR
    assert server.process is None and not os.listdir(tmp_path)  # work folders removed


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory):
    """A one-model repository (`tiny`, dynamic batching) as tests/serving/export/test_triton.py
    builds it, with the small dense shape: a fast tritonserver start."""
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.grpc")
    from kiln.serving.export.triton import export_triton
    from tests.serving.generate.tiny import tiny_generator, train_tokenizer

    repo = str(tmp_path_factory.mktemp("triton-faults") / "repo")
    gen = tiny_generator("llama", train_tokenizer())
    export_triton(gen, repo, model_name="tiny", max_batch_size=4, torch_threads=1)
    return repo


@pytest.mark.slow
def test_tritonserver_killed_under_load_is_restarted_no_client_sees_5xx(ray_session, triton_repo):
    from ray import serve

    from kiln.serving.client import KilnClient
    from kiln.serving.generate import Generator, SamplingParams
    from kiln.serving.rest_launch import launch

    prompts = [f"the {i} quick brown fox" for i in range(REQUESTS)]
    reference = Generator.load(os.path.join(triton_repo, "tiny", "1", "hf")).generate(
        prompts, SamplingParams(max_new_tokens=MAX_TOKENS)
    )
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # the supervisor's lines, whatever kiln's logging setup
    logging.getLogger("kiln.triton").addHandler(handler)
    settings = {"backend": "triton", "deployment": {"num_replicas": 2, "num_cpus": 0.25}}
    endpoint = launch(triton_repo, settings, port=free_port(), app_name=APP, route_prefix="/tf")
    try:
        triton = endpoint.triton
        assert triton is not None and triton.restart
        ports = (triton.http_port, triton.grpc_port)
        killed_pid = triton.process.pid
        done = threading.Semaphore(0)
        clients = threading.local()
        made: list[KilnClient] = []
        statuses: list[int] = []  # every HTTP status a client saw, retries included

        def ask(prompt: str) -> str:
            if not hasattr(clients, "c"):
                # ~1 s Retry-After x 40 covers a tritonserver restart on a loaded machine
                clients.c = KilnClient(endpoint.url, retries=40)
                clients.c._http.event_hooks["response"].append(
                    lambda r: statuses.append(r.status_code)
                )
                made.append(clients.c)
            try:
                return clients.c.complete(prompt, max_tokens=MAX_TOKENS, temperature=0)
            finally:
                done.release()

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            futures = [pool.submit(ask, p) for p in prompts]
            for _ in range(REQUESTS // 4):  # a quarter answered: the rest still to come
                assert done.acquire(timeout=120)
            os.kill(killed_pid, signal.SIGKILL)
            answers = [f.result(timeout=300) for f in futures]  # an error would raise here
        assert answers == [r.text for r in reference]

        assert triton.restarts == 1, triton.log_tail()
        restarted_s = triton.downtime_s  # from the exit seen (<= 0.2 s after it) to ready
        assert restarted_s < 30
        assert triton.process.pid != killed_pid and triton.process.poll() is None
        assert (triton.http_port, triton.grpc_port) == ports
        lines = [r.getMessage() for r in records]
        assert any(f"pid {killed_pid}) exited with code -9; restarting" in m for m in lines), lines
        assert any("tritonserver restarted" in m for m in lines), lines

        retried = sum(c.retried for c in made)
        unavailable = statuses.count(503)
        assert not [s for s in statuses if s >= 500 and s != 503], statuses
        assert unavailable == retried  # every 503 was retried, and nothing else was
        assert 0 < retried <= CONCURRENCY * (restarted_s + 5)  # ~1 per waiting client per second
        print(f"{retried} retried 503s for {REQUESTS} requests; restarted in {restarted_s:.1f} s")
    finally:
        logging.getLogger("kiln.triton").removeHandler(handler)
        endpoint.close()
        serve.shutdown()
    assert endpoint.triton is None
