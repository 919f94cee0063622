"""A real Ray head node for tests: started on free ports, stopped by killing its process group
(`ray stop` would stop every Ray on the machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import httpx

from tests.conftest import free_port

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 240  # a head node with its dashboard, on 2 cores shared with a busy machine


class HeadNode:
    def __init__(self, num_cpus: int = 4):
        self.gcs_port, self.dash_port = free_port(), free_port()
        self.num_cpus = num_cpus
        self.proc: subprocess.Popen | None = None

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dash_port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_AUTH_MODE": "disabled",
            "RAY_ADDRESS": "",
            # This head's own state API for its processes and ours (see kiln.platform.runtime):
            # `ray start` makes /tmp/ray/ray_current_cluster point here, and the default
            # resolution would let another cluster's processes, or these, ask the wrong one.
            "RAY_API_SERVER_ADDRESS": self.dashboard_url,
        }

    def __enter__(self) -> Self:
        cmd = [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            f"--port={self.gcs_port}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dash_port}",
            f"--num-cpus={self.num_cpus}",
            # Every fixed-default port on free ports too: the session's own Ray (tests/conftest.py)
            # already holds the defaults, and a job agent that cannot bind never accepts jobs.
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        ]
        # `ray start` gives its dashboard 60 s to register, then exits 1 (RAY_DASHBOARD_STARTUP_
        # TIMEOUT_S); a likely cause of the exit 1 once seen beside stress-ng, whose output was
        # not kept then. Now it gets this fixture's own bound, and its output is kept.
        env = {**self.env, "RAY_DASHBOARD_STARTUP_TIMEOUT_S": str(START_TIMEOUT_S)}
        self._output = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            process_group=0,  # not a new session: a new scheduler autogroup (triton_server.py)
            stdout=self._output,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S  # fails at once if `ray start` exits
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._output.seek(0)
                said = self._output.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{said}")
            try:
                if httpx.get(f"{self.dashboard_url}/api/version", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"Ray head node did not come up within {START_TIMEOUT_S} s")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None
        self._output.close()
