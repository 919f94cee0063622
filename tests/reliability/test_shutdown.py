"""`kiln serve` stops on SIGINT even when started with SIGINT ignored (as a non-interactive
shell's background job is): one line says so, every child process is gone, the port is free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from tests.conftest import free_port


def _can_listen(port: int) -> bool:
    """A new server can listen on `port` (as a restarted `kiln serve` binds: SO_REUSEADDR, so
    the closed connections' TIME_WAIT entries on the port, which a busy run leaves for 60 s,
    do not count as "bound"; a process still listening does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return True
        except OSError:
            return False


def _listeners(port: int) -> list[tuple]:
    """The processes listening on `port`: (pid, command line)."""
    return [
        (c.pid, psutil.Process(c.pid).cmdline()[:3] if c.pid else None)
        for c in psutil.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    ]


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_kiln_serve_stops_on_signal_even_with_sigint_inherited_ignored(tmp_path, sig):
    from tests.serving.rest.tiny_model import make_tiny_model

    model = make_tiny_model(str(tmp_path / "tiny"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "kiln", "serve", model, "--port", str(port), "--num-cpus", "0.5"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        line, deadline = "", time.monotonic() + 240
        while "kiln: serving" not in line:
            line = proc.stdout.readline()
            assert (line or proc.poll() is None) and time.monotonic() < deadline, "no start"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=30) as r:
            assert r.status == 200
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children  # Ray's processes (GCS, raylet, the replica, the HTTP proxy)
        t0 = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        stopped_in = time.monotonic() - t0
        out = proc.stdout.read()
        assert "kiln: stopped serving" in out, out[-2000:]
        assert _until(lambda: not any(c.is_running() for c in children), 30), [
            c.pid for c in children if c.is_running()
        ]
        assert _until(lambda: not _listeners(port) and _can_listen(port), 15), (
            f"port {port} still bound: {_listeners(port)}"
        )
        print(f"kiln serve stopped {stopped_in:.1f}s after {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
