"""Two replicas of the REST deployment under bounded concurrent load; one replica's process is
SIGKILLed mid-load. Clients retrying idempotent requests per KilnClient's policy see no 5xx and
every answer equals the model's; Serve is back to 2 running replicas within 30 s."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import free_port

REQUESTS = 48
CONCURRENCY = 6
APP = "reliability-faults"


def _replica_pids() -> list[int]:
    from ray._private.state import actors

    return [
        a["Pid"]
        for a in actors().values()
        if a["State"] == "ALIVE" and a["ActorClassName"].startswith("ServeReplica:" + APP)
    ]


def _running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None:
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())


@pytest.mark.slow
def test_replica_killed_under_load_no_client_sees_5xx(ray_session, tmp_path):
    from ray import serve

    from kiln.engine.generator import Generator, SamplingParams
    from kiln.serving.client import KilnClient
    from kiln.serving.launch import launch
    from tests.serving.rest.tiny_model import make_tiny_model

    model = make_tiny_model(str(tmp_path / "tiny"))
    settings = {
        "batching": {"max_batch_size": 4},
        "deployment": {"num_replicas": 2, "num_cpus": 0.25},
    }
    endpoint = launch(model, settings, port=free_port(), app_name=APP, route_prefix="/faults")
    try:
        prompts = [f"the {i} quick brown fox" for i in range(REQUESTS)]
        reference = Generator.load(model).generate(prompts, SamplingParams(max_new_tokens=6))
        pids = _replica_pids()
        assert len(pids) == 2
        done = threading.Semaphore(0)
        clients = threading.local()
        made: list[KilnClient] = []

        def ask(prompt: str) -> str:
            if not hasattr(clients, "c"):
                clients.c = KilnClient(endpoint.url, retries=8)
                made.append(clients.c)
            try:
                return clients.c.complete(prompt, max_tokens=6, temperature=0)
            finally:
                done.release()

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            futures = [pool.submit(ask, p) for p in prompts]
            for _ in range(REQUESTS // 4):  # a quarter answered: the rest still to come
                done.acquire(timeout=120)
            os.kill(pids[0], signal.SIGKILL)
            answers = [f.result(timeout=300) for f in futures]  # an error would raise here
        assert answers == [r.text for r in reference]
        retried = sum(c.retried for c in made)
        assert retried <= REQUESTS  # counted and bounded: at most one retry per request here
        print(f"{retried} retries for {REQUESTS} requests")

        deadline = time.monotonic() + 30
        while _running_replicas() < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _running_replicas() == 2
        assert pids[0] not in _replica_pids()
    finally:
        endpoint.close()
        serve.shutdown()
