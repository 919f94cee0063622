"""Run the real tritonserver that the `nvidia-pytriton` wheel ships, on free local ports.
With `restart=True` a supervisor thread restarts a server that exits on its own (crash, OOM
kill) with the same repository and ports, backing off, at most `max_restarts` times per
`restart_window_s`; gRPC clients reconnect to it by themselves.

    with TritonServer("exported/triton") as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
        ...

What it takes to run here (docs/architecture.md, "Facts the design rests on"): the
interpreter's LIBDIR and the wheel's `nvidia_pytriton.libs` on LD_LIBRARY_PATH, this
environment's `bin/` first on PATH (the python-backend stub takes its Python from there), and a
backend directory holding `backends/python` plus the stub built for this Python version.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from http.client import HTTPException
from typing import Self

from kiln.platform.errors import InputError, KilnError
from kiln.platform.signals import stop_on_signals
from kiln.serving.triton.stale import SHM_DIR, clean_stale, shm_prefix, workdir_prefix
from kiln.serving.triton.stubs import DeadlockWatch, StubDeadlock, dump_stubs

log = logging.getLogger("kiln.triton")
START_ATTEMPTS = 5  # a start that crashes or deadlocks is tried again, this many times in all


def _free_ports(n: int) -> list[int]:
    """n distinct free ports: the sockets stay bound until all are chosen (one closed socket's
    port can be handed out again at once, and tritonserver refuses equal HTTP/metrics ports)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies, so a killed `kiln`
    never leaves a tritonserver behind; and SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _pytriton_dirs() -> tuple[str, str]:
    """(tritonserver dist dir, bundled shared-library dir) of the installed nvidia-pytriton."""
    try:
        import pytriton
    except ImportError:
        raise KilnError(
            "tritonserver needs the nvidia-pytriton package (pip install nvidia-pytriton)"
        ) from None
    package = os.path.dirname(pytriton.__file__)
    return os.path.join(package, "tritonserver"), os.path.join(
        os.path.dirname(package), "nvidia_pytriton.libs"
    )


class TritonServer:
    """A tritonserver process over `repo_dir`: started on free ports, ready on enter, stopped on
    exit."""

    def __init__(
        self,
        repo_dir: str,
        *,
        host: str = "127.0.0.1",
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        startup_timeout_s: float = 180.0,
        log_verbose: int = 0,
        extra_args: list[str] | None = None,
        restart: bool = False,
        max_restarts: int = 5,
        restart_window_s: float = 300.0,
    ) -> None:
        if not os.path.isdir(repo_dir):
            raise InputError(f"{repo_dir}: no such Triton model repository")
        self.repo_dir = os.path.abspath(repo_dir)
        self.host = host
        free = iter(_free_ports(3))
        self.http_port = http_port or next(free)
        self.grpc_port = grpc_port or next(free)
        self.metrics_port = metrics_port or next(free)
        self.startup_timeout_s = startup_timeout_s
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen | None = None
        self._workdir: str | None = None
        self._shm: str | None = None  # this server's shared-memory name prefix
        self.log_path: str | None = None
        self.restart = restart
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.restarts = 0  # how many times the supervisor restarted the server
        self.downtime_s: float | None = None  # the last restart: exit seen -> ready again
        self.launch_s: float | None = None  # the last successful launch: process start -> ready
        self.returncode: int | None = None  # the last exit code the supervisor saw
        self.gave_up = False  # the supervisor stopped restarting (too many quick failures)
        self._stopping = threading.Event()
        self._lock = threading.RLock()  # process / workdir, between stop() and the supervisor
        self._supervisor: threading.Thread | None = None

    # tritonclient takes host:port without a scheme
    @property
    def http_url(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        """The backend directory, the command line and the environment."""
        dist, libs = _pytriton_dirs()
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = os.path.join(dist, "python_backend_stubs", version, "triton_python_backend_stub")
        if not os.path.exists(stub):
            raise KilnError(f"nvidia-pytriton has no python-backend stub for Python {version}")
        clean_stale()  # folders and shm segments a SIGKILLed kiln left behind
        self._workdir = tempfile.mkdtemp(prefix=workdir_prefix())
        backends = os.path.join(self._workdir, "backends")
        shutil.copytree(os.path.join(dist, "backends", "python"), os.path.join(backends, "python"))
        shutil.copy(stub, os.path.join(backends, "python", "triton_python_backend_stub"))
        env = dict(os.environ)
        lib_dirs = [sysconfig.get_config_var("LIBDIR") or "", libs, env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in lib_dirs if p)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        # each server gets its own shared-memory names, so servers running side by side never clash
        shm = self._shm = shm_prefix(uuid.uuid4().hex[:6])
        cmd = [
            os.path.join(dist, "bin", "tritonserver"),
            f"--model-repository={self.repo_dir}",
            f"--backend-directory={backends}",
            f"--backend-config=python,shm-region-prefix-name={shm}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
            *self.extra_args,
        ]
        return cmd, env

    def start(self) -> Self:
        """Start and wait until ready. On a loaded machine the python backend can fail a start
        at random while a stub starts: it aborts (a `boost::interprocess::lock_exception`, as in
        triton-inference-server/server#8882) or deadlocks (`StubDeadlock`). Such a start is
        tried again, up to `START_ATTEMPTS` times in all. An error exit (a model that does not
        load) or a start that times out fails at once."""
        self._stopping.clear()
        for attempt in range(1, START_ATTEMPTS + 1):
            self.returncode = None
            try:
                self._launch()
                break
            except KilnError as e:
                if isinstance(e, StubDeadlock):
                    what = "deadlocked on a python-backend stub"
                elif self.returncode is not None and self.returncode < 0:
                    what = f"died of signal {-self.returncode}"
                else:
                    what = None
                if what and attempt < START_ATTEMPTS and not self._stopping.is_set():
                    log.warning(
                        "tritonserver %s while starting (attempt %d of %d): starting it again",
                        what,
                        attempt,
                        START_ATTEMPTS,
                    )
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
        if self.restart:
            self._supervisor = threading.Thread(
                target=self._supervise, name="triton-supervisor", daemon=True
            )
            self._supervisor.start()
        return self

    def _launch(self) -> None:
        """Start the process and wait until it is ready (killing it if it never is)."""
        with self._lock:
            cmd, env = self._prepare()
            launched = time.monotonic()
            self.log_path = os.path.join(self._workdir, "tritonserver.log")
            log.info("starting tritonserver on http %s, grpc %s", self.http_url, self.grpc_url)
            with open(self.log_path, "wb") as out:
                # PR_SET_DEATHSIG fires when the spawning *thread* ends: only tie the server to
                # the main thread or the supervisor (it lives while the server should run)
                current = threading.current_thread()
                tied = current is threading.main_thread() or current is self._supervisor
                # Its own process group (killpg reaches its stubs; a terminal's Ctrl-C does not)
                # but kiln's session: a new session is a new scheduler autogroup on Linux, where
                # a busy machine can starve a stub past the 1 s its health thread is given
                # (docs/reliability.md; the stub waits are in docs/benchmarks.md).
                self.process = subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    process_group=0,
                    preexec_fn=_die_with_parent if tied else None,
                )
        try:
            self._wait_ready()
        except BaseException:
            if self.process is not None and self.process.poll() is not None:
                self.returncode = self.process.returncode
            self._terminate()
            raise
        self.launch_s = time.monotonic() - launched

    def _supervise(self) -> None:
        """Restart the server when it exits while not stopping: 0.5 s, 1 s, 2 s ... (at most
        30 s) apart; give up after `max_restarts` restarts within `restart_window_s` (also
        counting restarts that never became ready)."""
        recent: deque[float] = deque()
        while not self._stopping.wait(0.2):
            proc = self.process
            if proc is None or proc.poll() is None:
                continue
            down_since = time.monotonic()
            self.returncode = proc.returncode
            what = f"tritonserver (pid {proc.pid}) exited with code {proc.returncode}"
            self._terminate()  # its python-backend stubs and work folder
            while True:
                now = time.monotonic()
                while recent and now - recent[0] > self.restart_window_s:
                    recent.popleft()
                if len(recent) >= self.max_restarts:
                    log.error(
                        "%s; %d restarts in %.0f s already: giving up",
                        what,
                        len(recent),
                        self.restart_window_s,
                    )
                    self.gave_up = True
                    return
                delay = min(0.5 * 2 ** len(recent), 30.0)
                log.warning(
                    "%s; restarting in %.1f s on http %s, grpc %s",
                    what,
                    delay,
                    self.http_url,
                    self.grpc_url,
                )
                recent.append(now)
                if self._stopping.wait(delay):
                    return
                try:
                    self._launch()
                    break
                # it never became ready, or anything else went wrong with it: count it, go
                # on (a supervisor that dies of an odd exception would leave no server)
                except Exception as e:  # noqa: BLE001
                    if self._stopping.is_set():
                        return
                    first = (str(e).splitlines() or [type(e).__name__])[0].rstrip(":")
                    what = f"tritonserver restart failed ({first})"
            self.restarts += 1
            self.downtime_s = time.monotonic() - down_since
            log.info(
                "tritonserver restarted (pid %d) after %.1f s down",
                self.process.pid,
                self.downtime_s,
            )

    def _wait_ready(self) -> None:
        url = f"http://{self.http_url}/v2/health/ready"
        deadline = time.monotonic() + self.startup_timeout_s
        deadlock = DeadlockWatch()
        while time.monotonic() < deadline:
            deadlock.check(self.process.pid)
            if self._stopping.is_set():
                raise KilnError("tritonserver stopped while starting")
            if self.process.poll() is not None:
                raise KilnError(
                    f"tritonserver exited with code {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            # a server still starting can also end an answer early (http.client's errors)
            except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException):
                pass
            time.sleep(0.25)
        dump_stubs(self.process.pid)
        raise KilnError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail(120)}"
        )

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Triton drains for up to --exit-timeout-secs), SIGKILL if it lingers."""
        self._stopping.set()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(timeout=self.startup_timeout_s)
        self._terminate(timeout_s)

    def _terminate(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            proc, self.process = self.process, None
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout_s)
            if proc is not None:
                # its own session: a lingering server, and the stubs a killed one left, go too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if self._workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            if self._shm:  # the segments of stubs killed before they could unlink them
                for name in glob.glob(os.path.join(SHM_DIR, f"{glob.escape(self._shm)}*")):
                    with contextlib.suppress(OSError):
                        os.remove(name)
                self._shm = None

    def wait(self) -> int:
        """Block until the server exits (with `restart`: until the supervisor gives up) or
        SIGINT/SIGTERM arrives (KeyboardInterrupt; for `kiln triton up`). The exit code."""
        stop_on_signals()
        while self._supervisor is not None and self._supervisor.is_alive():
            self._supervisor.join(1.0)  # restarts happen here; returns when it gives up
        proc = self.process
        if self.gave_up:
            return self.returncode or 1
        return proc.wait() if proc is not None else 0

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
