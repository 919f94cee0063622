"""The embedded Ray's processes query only its own state API.

Ray Train V2's PlacementGroupCleaner asks the state API whether the run's controller is alive
and removes the run's placement group when told "no such actor". Resolved the default way, the
state API may reach another cluster on the machine (a newer `ray start`, a dashboard on
127.0.0.1:8265), which knows nothing of our controller: a live run lost its workers.
"""

from __future__ import annotations

import os
import socket

import pytest

from kiln.platform.runtime import API_SERVER_ENV, DEFAULT_DASHBOARD_PORT


def test_state_api_in_ray_workers_never_reaches_another_cluster(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Probe:
        def actor_id(self) -> str:
            return ray.get_runtime_context().get_actor_id()

        def ask_state_api(self, actor_id: str):
            from ray.dashboard.utils import get_address_for_submission_client
            from ray.train.v2._internal.state.util import is_actor_alive
            from ray.util.state.exception import RayStateApiException

            try:  # what the cleaner calls, for a live actor
                alive = is_actor_alive(actor_id=actor_id, timeout=5)
            except RayStateApiException:
                alive = "unavailable"  # the cleaner keeps monitoring and removes nothing
            return get_address_for_submission_client(None), alive

    probe = Probe.remote()
    try:
        url, alive = ray.get(probe.ask_state_api.remote(ray.get(probe.actor_id.remote())))
    finally:
        ray.kill(probe)
    assert alive is not False and alive is not None, "a live actor reported dead"
    host, port = url.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) != DEFAULT_DASHBOARD_PORT, url
    # No dashboard in this Ray: its API port is held and refuses, nobody else can answer there.
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect((host, int(port)))
    # The test process's own environment is untouched (`ray job submit` children stay correct).
    assert os.environ.get(API_SERVER_ENV) != url
