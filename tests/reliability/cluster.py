"""A 2-node Ray cluster on 127.0.0.1 (head + one worker node, real raylets, as Ray's own
`cluster_utils` tests do), separate from the session's `ray_session`: drivers reach it from
subprocesses through RAY_ADDRESS, so the pytest process's own Ray is never touched."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
# Ray notices a dead raylet in ~1.5 s instead of ~30 s
FAST_HEALTH_CHECK = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}

# A driver resolves "127.0.0.1" in RAY_ADDRESS to the machine's outward IP (where nothing of this
# cluster listens) unless Ray is told to stay on loopback, as it does on macOS/Windows.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# every process on the worker node sees this (fault hooks use it to act on that node only);
# the head node's processes see "head"
WORKER_ENV = {"KILN_TEST_NODE": "worker"}
HEAD_ENV = {"KILN_TEST_NODE": "head"}


class TwoNodeCluster:
    """Head (`head_cpus`) + one worker node (`worker_cpus`); `kill_worker_node()` SIGKILLs the
    worker node's raylet and everything on it."""

    def __init__(self, head_cpus: float = 1, worker_cpus: float = 1) -> None:
        from ray.cluster_utils import Cluster

        self.worker_cpus = worker_cpus
        dashboard_port = free_port()
        # every process of this cluster asks its own dashboard, never another cluster's on :8265
        # (Ray Train's placement-group cleaner would otherwise drop a live run's group)
        self._api = {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard_port}"}
        with _raylet_env({**self._api, **HEAD_ENV}):
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": head_cpus,
                    "gcs_server_port": free_port(),
                    # the dashboard and its job agent: `kiln submit` sends jobs here
                    "include_dashboard": True,
                    "dashboard_host": "127.0.0.1",
                    "dashboard_port": dashboard_port,
                    "dashboard_agent_listen_port": free_port(),
                    "runtime_env_agent_port": free_port(),
                    "node_ip_address": "127.0.0.1",
                    "_system_config": FAST_HEALTH_CHECK,
                },
            )
        self.worker = None
        self.node_killed = False  # once a node was killed, the next test gets a fresh cluster
        self.start_worker_node()
        self.address = self.cluster.address
        self.dashboard_url = f"http://{self.cluster.webui_url}"

    def start_worker_node(self) -> None:
        """(Re)start the worker node: a new raylet with the same resources (a node that comes
        back gets a new node id, as a restarted machine does); returns once it has registered."""
        with _raylet_env(self._api):
            self.worker = self.cluster.add_node(
                num_cpus=self.worker_cpus,
                node_ip_address="127.0.0.1",
                env_vars=WORKER_ENV,
                # not the default 52365, which another Ray on this machine may hold: the job
                # head sends submissions to any node's agent
                dashboard_agent_listen_port=free_port(),
                runtime_env_agent_port=free_port(),  # (a job's working_dir is set up by it)
            )

    def kill_worker_node(self) -> None:
        """SIGKILL the worker node's processes (raylet, agents, every worker) all at once and
        return when they are gone, as a machine losing power. Ray's own removal kills the raylet,
        and a worker notices that only later: a paused training rank could still run its next
        step (and save a checkpoint) after this returned."""
        import psutil

        tree = []
        for procs in self.worker.all_processes.values():
            for info in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc = psutil.Process(info.process.pid)
                    tree += [proc, *proc.children(recursive=True)]
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = None
        self.node_killed = True
        deadline = time.monotonic() + 30
        while alive := [p for p in tree if _running(p)]:
            assert time.monotonic() < deadline, f"worker node processes survived SIGKILL: {alive}"
            time.sleep(0.05)

    def driver(self, args: list[str], log_path: str) -> subprocess.Popen:
        """Start `python *args` as a driver of this cluster, its output in `log_path` (a file, not
        a pipe: Ray's log lines would fill a pipe nobody reads and block the driver)."""
        env = {**os.environ, "RAY_ADDRESS": self.address, "PYTHONPATH": str(REPO), **LOOPBACK}
        env.update(self._api)
        with open(log_path, "w") as log:
            return subprocess.Popen(
                [sys.executable, *args],
                cwd=str(REPO),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def loopback_python(self, folder: Path) -> Path:
        """A `python` for job entrypoints (`kiln submit --python`, `ray job submit -- ...`) that
        attaches to this cluster: a job's driver attaches by RAY_ADDRESS, which Ray sets to the
        machine's outward IP, and this cluster lives on loopback."""
        python = folder / "python-loopback"
        python.write_text(f'#!/bin/sh\nRAY_ADDRESS={self.address} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        return python

    def shutdown(self) -> None:
        self.cluster.shutdown()


def _running(proc) -> bool:
    """Not yet dead: a killed process whose parent (here, often a container's init that does not
    reap) has not collected it is a zombie, which runs nothing."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def _raylet_env(extra: dict[str, str]):
    """Raylets (and so every worker) import kiln and tests from this checkout and stay on
    loopback; the Ray address file other clusters on this machine use is left as found."""
    from ray._private.utils import read_ray_address

    previous = read_ray_address()
    # the dashboard agent's own ray.init (job submission) must stay on loopback too
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(LOOPBACK)
    env.update(extra)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        _restore_ray_address_file(previous)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _restore_ray_address_file(previous: str | None) -> None:
    """`Cluster` advertises itself in /tmp/ray for `ray.init()`; other clusters run here."""
    from ray._private.utils import get_ray_address_file

    path = get_ray_address_file(None)
    if previous:
        with open(path, "w") as f:
            f.write(previous)
    elif os.path.exists(path):
        os.remove(path)
