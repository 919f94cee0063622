"""`kiln triton up`'s tritonserver dies with it when it is SIGKILLed. That it stops on SIGINT
even when it inherited SIGINT ignored (a background non-interactive shell's `cmd &`), exit 0,
"tritonserver stopped", the server reaped, is tests/serving/export/test_triton.py's
`test_kiln_triton_up_restarts_a_dead_server_and_stops_on_sigint` (on a restarted server)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pytriton")
pytestmark = pytest.mark.slow  # kiln and tritonserver processes


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(repo) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "triton", "up", str(repo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignore_sigint,
    )
    deadline, line = time.monotonic() + 180, ""
    while "ready" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "kiln triton up exited early"
    return proc, int(re.search(r"http 127\.0\.0\.1:(\d+)", line).group(1))


def _tritonservers(http_port: int) -> list[int]:
    """Pids of tritonserver processes serving on `http_port`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(b"tritonserver") and f"--http-port={http_port}".encode() in args:
            pids.append(int(pid))
    return pids


def _gone(http_port: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _tritonservers(http_port) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _tritonservers(http_port)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DEATHSIG is Linux's")
def test_sigkill_takes_tritonserver_along(tmp_path):
    proc, port = _start(tmp_path)  # an empty model repository: the server starts in seconds
    try:
        assert len(_tritonservers(port)) == 1
        proc.kill()  # no chance to clean up: the kernel's death signal must do it
        proc.wait()
        assert _gone(port, 20)
    finally:
        for pid in _tritonservers(port):
            os.kill(pid, signal.SIGKILL)
