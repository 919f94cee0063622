"""The REST deployment on the triton backend under bounded concurrent load; the tritonserver
kiln started is SIGKILLed mid-load. Kiln restarts it on the same ports within 30 s; meanwhile the
REST layer answers 503 + Retry-After (never 500), so clients retrying per KilnClient's policy
see no 5xx and every answer equals kiln's own greedy text. Streamed requests running beside
them: one cut mid-generation (most runs: see the assertion) ends with an OpenAI error event
(code 503) and `[DONE]`, never a dropped connection; one started while the server is down is
refused with 503 + Retry-After before any header, and retried."""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kiln.platform.imports import import_object
from tests.conftest import free_port

REQUESTS = 48
CONCURRENCY = 6
MAX_TOKENS = 6
STREAM_TOKENS = 64  # ~1-2 s of generation: a stream is cut mid-way when the server dies
APP = "reliability-triton-faults"


def test_triton_down_is_503_with_retry_after():
    """No server on the Triton port: each protocol's route answers 503 + Retry-After, not 500."""
    pytest.importorskip("tritonclient.grpc")
    from fastapi.testclient import TestClient

    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.triton import TritonBackend

    backend = TritonBackend(f"127.0.0.1:{free_port()}", "tiny")
    with TestClient(create_api(backend, Limits())) as client:
        for path, body in (
            ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
            (
                "/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            ),
            ("/v2/models/tiny/generate", {"text_input": "hi", "max_tokens": 2}),
            # streams fail before their first token: a plain 503 before any header is sent
            ("/v1/completions", {"model": "tiny", "prompt": "hi", "stream": True}),
            (
                "/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            ),
            ("/v2/models/tiny/generate_stream", {"text_input": "hi", "max_tokens": 2}),
        ):
            r = client.post(path, json=body)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["retry-after"] == "1"
            assert "unavailable" in r.text


def test_a_dropped_grpc_connection_is_unavailable_a_verdict_is_not():
    """What the triton backend answers 503 for: gRPC UNAVAILABLE, and gRPC core's INTERNAL when
    the connection broke while a streamed request was being sent; not Triton's own errors."""
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tritonclient.grpc")
    from grpc.aio import AioRpcError, Metadata
    from tritonclient.utils import InferenceServerException

    from kiln.serving.backends.triton import _is_unavailable

    def rpc(code, details):
        return AioRpcError(code, Metadata(), Metadata(), details)

    assert _is_unavailable(rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert _is_unavailable(rpc(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert _is_unavailable(ConnectionRefusedError())
    assert not _is_unavailable(rpc(grpc.StatusCode.INTERNAL, "model tiny: out of memory"))
    assert not _is_unavailable(InferenceServerException("in-band error from the model"))


def dying_server(workdirs, never_ready: tuple[int, ...] = ()):
    """A TritonServer whose process exits with code 3 0.3 s after start (not a tritonserver);
    the launches numbered in `never_ready` (0: the first) fail to become ready."""
    from kiln.platform.errors import KilnError
    from kiln.serving.triton.server import TritonServer

    class Dying(TritonServer):
        launches = 0

        def _prepare(self):
            self._workdir = tempfile.mkdtemp(dir=workdirs)
            return [sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"], None

        def _wait_ready(self):
            self.launches += 1
            if self.launches - 1 in never_ready:
                raise KilnError("tritonserver not ready after 180 s:\n(its log)")

    return Dying


@pytest.fixture
def triton_records():
    """WARNING+ records of the `kiln.triton` logger (the supervisor's lines)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # whatever kiln's logging setup
    logging.getLogger("kiln.triton").addHandler(handler)
    yield records
    logging.getLogger("kiln.triton").removeHandler(handler)


def test_supervisor_restarts_with_backoff_then_gives_up(tmp_path, triton_records):
    """A server that keeps dying is restarted `max_restarts` times (0.5 s, 1 s apart; a restart
    that never becomes ready counts and is retried), then the supervisor gives up with an error
    line and `wait()` returns the exit code."""
    server = dying_server(tmp_path, never_ready=(1,))(str(tmp_path), restart=True, max_restarts=2)
    try:
        server.start()
        assert server.wait() == 3  # returns once the supervisor gives up
    finally:
        server.stop()
    lines = [r.getMessage() for r in triton_records]
    assert server.restarts == 1 and server.launches == 3 and server.gave_up
    assert len(lines) == 3, lines  # one line per restart, one to give up
    assert "exited with code 3; restarting in 0.5 s" in lines[0]
    assert lines[1].startswith(
        "tritonserver restart failed (tritonserver not ready after 180 s); restarting in 1.0 s"
    )
    assert "exited with code 3; 2 restarts in 300 s already: giving up" in lines[2]
    assert triton_records[-1].levelno == logging.ERROR
    assert server.process is None and not os.listdir(tmp_path)  # work folders removed


def test_kiln_triton_up_gives_up_with_one_error_line(tmp_path, triton_records, monkeypatch, capsys):
    """`kiln triton up` supervises its server as serve does: one console line per restart, and
    after `--max-restarts` quick failures one error line and exit code 1 (no `stopped` line)."""
    from kiln.platform.cli import build_parser
    from kiln.serving.export import commands as export_commands

    monkeypatch.setattr(export_commands, "TritonServer", dying_server(tmp_path))
    args = build_parser().parse_args(["triton", "up", str(tmp_path), "--max-restarts", "1"])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert import_object(args.handler)(args) == 1
    finally:
        for s, handler in handlers.items():  # `triton up` installs its own
            signal.signal(s, handler)
    out = capsys.readouterr().out
    assert "tritonserver ready (pid " in out and "stopped" not in out
    lines = [(r.levelno, r.getMessage()) for r in triton_records]
    assert len(lines) == 2, lines
    assert (
        lines[0][0] == logging.WARNING and "exited with code 3; restarting in 0.5 s" in lines[0][1]
    )
    assert lines[1][0] == logging.ERROR and lines[1][1].endswith(
        "1 restarts in 300 s already: giving up"
    )


class Streamer:
    """A client that streams one prompt over and over (`/v1/completions` or chat) until told to
    stop, retrying a 503 refused before the headers after its Retry-After (KilnClient's policy).
    Each stream must end in `[DONE]`; it records what each request came to."""

    def __init__(self, url: str, chat: bool, stop: threading.Event):
        import httpx

        self.http = httpx.Client(base_url=url, timeout=120)
        self.chat, self.stop = chat, stop
        self.started = threading.Event()  # set when a stream sends its first text
        self.done: list[str] = []  # texts of streams that finished
        self.cut: list[str] = []  # text sent before an error event (the server died)
        self.refused = 0  # 503 + Retry-After before any header

    def body(self) -> tuple[str, dict]:
        if self.chat:
            messages = [{"role": "user", "content": "stream 1"}]
            return "/v1/chat/completions", {"messages": messages}
        return "/v1/completions", {"prompt": "stream 0"}

    def run(self) -> None:
        try:
            while not (self.stop.is_set() and self.done):  # one stream finished at least
                self.once()
        finally:
            self.http.close()

    def once(self) -> None:
        path, body = self.body()
        body |= {"model": "tiny", "max_tokens": STREAM_TOKENS, "temperature": 0, "stream": True}
        with self.http.stream("POST", path, json=body) as r:
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1", r.headers
                assert "unavailable" in r.read().decode()
                self.refused += 1
                time.sleep(float(r.headers["retry-after"]))
                return
            assert r.status_code == 200, (r.status_code, r.read())
            events, text = [], ""
            for line in r.iter_lines():  # a dropped connection raises here
                if not line.startswith("data: "):
                    continue
                events.append(line.removeprefix("data: "))
                if events[-1] == "[DONE]":
                    break
                event = json.loads(events[-1])
                if "error" in event:
                    continue
                choice = event["choices"][0]
                delta = choice["delta"].get("content", "") if self.chat else choice["text"]
                if delta and not text:
                    self.started.set()
                text += delta
        assert events[-1] == "[DONE]", events  # the stream was ended, not dropped
        errors = [json.loads(e) for e in events[:-1] if "error" in json.loads(e)]
        if not errors:
            self.done.append(text)
            return
        # the server died mid-generation: one OpenAI error event, the last before [DONE]
        assert len(errors) == 1 and json.loads(events[-2]) == errors[0], events
        error = errors[0]["error"]
        assert error["code"] == "service_unavailable" and "unavailable" in error["message"]
        self.cut.append(text)


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory):
    """A one-model repository (`tiny`, decoupled: streams token by token, batched at every
    step) as tests/serving/export/test_triton.py builds it, with the small dense shape: a fast
    tritonserver start."""
    pytest.importorskip("pytriton")
    pytest.importorskip("tritonclient.grpc")
    from kiln.serving.export.triton import export_triton
    from tests.engine.tiny import tiny_generator, train_tokenizer

    repo = str(tmp_path_factory.mktemp("triton-faults") / "repo")
    gen = tiny_generator("llama", train_tokenizer())
    export_triton(gen, repo, model_name="tiny", decoupled=True, torch_threads=1)
    return repo


@pytest.mark.slow
def test_tritonserver_killed_under_load_is_restarted_no_client_sees_5xx(
    ray_session, triton_repo, triton_records
):
    from ray import serve

    from kiln.engine.generator import Generator, SamplingParams
    from kiln.serving.client import KilnClient
    from kiln.serving.launch import launch

    prompts = [f"the {i} quick brown fox" for i in range(REQUESTS)]
    generator = Generator.load(os.path.join(triton_repo, "tiny", "1", "hf"))
    reference = generator.generate(prompts, SamplingParams(max_new_tokens=MAX_TOKENS))
    (streamed,) = generator.generate(["stream 0"], SamplingParams(max_new_tokens=STREAM_TOKENS))
    settings = {"backend": "triton", "deployment": {"num_replicas": 2, "num_cpus": 0.25}}
    endpoint = launch(triton_repo, settings, port=free_port(), app_name=APP, route_prefix="/tf")
    try:
        triton = endpoint.triton
        assert triton is not None and triton.restart
        ports = (triton.http_port, triton.grpc_port)
        killed_pid, killed_shm = triton.process.pid, triton._shm
        first_launch_s = triton.launch_s
        done = threading.Semaphore(0)
        clients = threading.local()
        made: list[KilnClient] = []
        statuses: list[int] = []  # every HTTP status a client saw, retries included

        def ask(prompt: str) -> str:
            if not hasattr(clients, "c"):
                # ~1 s Retry-After, for up to 150 s: a restart on a loaded machine can take more
                # than one start (Triton's python backend fails some: docs/reliability.md), up
                # to ~30 s each, and the supervisor tries up to 5 (max_restarts)
                clients.c = KilnClient(endpoint.url, retries=150, retry_for=150)
                clients.c._http.event_hooks["response"].append(
                    lambda r: statuses.append(r.status_code)
                )
                made.append(clients.c)
            try:
                return clients.c.complete(prompt, max_tokens=MAX_TOKENS, temperature=0)
            finally:
                done.release()

        stop = threading.Event()
        streamers = [Streamer(endpoint.url, chat, stop) for chat in (False, True)]
        with ThreadPoolExecutor(CONCURRENCY) as pool, ThreadPoolExecutor(2) as streaming:
            streams = [streaming.submit(s.run) for s in streamers]
            try:
                half = REQUESTS // 2
                futures = [pool.submit(ask, p) for p in prompts[:half]]
                for _ in range(REQUESTS // 4):  # a quarter answered: the rest still to come
                    assert done.acquire(timeout=120)
                # a completion stream that just sent its first text, ~63 tokens to go: cut
                streamers[0].started.clear()
                assert streamers[0].started.wait(timeout=60)
                # the second half goes out as the server dies: on a loaded machine the wait for
                # the stream can outlast the first half, and no request would meet the restart
                futures += [pool.submit(ask, p) for p in prompts[half:]]
                os.kill(killed_pid, signal.SIGKILL)
                answers = [f.result(timeout=300) for f in futures]  # an error would raise here
            finally:
                stop.set()
            for f in streams:
                f.result(timeout=120)  # a dropped stream or a 5xx would raise here
        assert answers == [r.text for r in reference]

        # clients can be answered by the new server before the supervisor's next readiness poll
        # (every 0.25 s) counts the restart: wait for that poll, bounded like the downtime
        deadline = time.monotonic() + 30
        while triton.restarts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert triton.restarts == 1, triton.log_tail()
        lines = [r.getMessage() for r in triton_records]
        # beside a CPU hog the python backend fails some starts: the first start's retries
        # ("... while starting") come before the kill, the supervisor's failed restarts after it
        killed = [i for i, line in enumerate(lines) if f"pid {killed_pid}) exited" in line]
        assert len(killed) == 1 and "with code -9; restarting" in lines[killed[0]], lines
        assert all("while starting" in line for line in lines[: killed[0]]), lines
        # one warning line for the restart (the "restarted" line is INFO: the run log only), and
        # one more for each restart that failed
        lines = lines[killed[0] :]
        assert all("tritonserver restart failed" in line for line in lines[1:]), lines
        assert len(lines) <= 5, lines  # the supervisor's max_restarts
        restarted_s = triton.downtime_s  # from the exit seen (<= 0.2 s after it) to ready
        # < 30 s a start (4.8-10.9 s measured at load 0.5-7.9); where this server's first start
        # was slower (beside a CPU hog, where a restart once took 31.8 s), twice its time
        per_start = max(30.0, 2 * first_launch_s)
        assert restarted_s < per_start * len(lines), (restarted_s, first_launch_s)
        assert triton.process.pid != killed_pid and triton.process.poll() is None
        assert (triton.http_port, triton.grpc_port) == ports
        # the killed server's python-backend stubs could not unlink their shared memory: kiln did
        assert not glob.glob(f"/dev/shm/{killed_shm}*")

        retried = sum(c.retried for c in made)
        unavailable = statuses.count(503)
        assert not [s for s in statuses if s >= 500 and s != 503], statuses
        assert unavailable == retried  # every 503 was retried, and nothing else was
        assert 0 < retried <= CONCURRENCY * (restarted_s + 5)  # ~1 per waiting client per second

        completion, chat = streamers
        assert completion.done and set(completion.done) == {streamed.text}
        assert chat.done and len(set(chat.done)) == 1  # greedy: every finished chat is the same
        cut = [(s, text) for s in streamers for text in s.cut]
        # each streamer had at most one stream in flight when the server died: at most that one
        # is cut. Usually the completion stream is (its error event checked in Streamer.once),
        # but not always: by the time its first text reaches the client, the server may have
        # generated all of it (1 idle run in ~7 saw no cut), so a cut is counted, not required.
        assert len(cut) <= len(streamers), cut
        for s, text in cut:  # what was sent before the error is the answer's beginning
            assert (streamed.text if s is completion else chat.done[0]).startswith(text)
        refused = sum(s.refused for s in streamers)
        assert refused >= 1  # a stream started while the server was down: 503 before headers
        print(
            f"{retried} retried 503s for {REQUESTS} requests; restarted in {restarted_s:.1f} s "
            f"(first start {first_launch_s:.1f} s); "
            f"streams: {sum(len(s.done) for s in streamers)} finished, {len(cut)} cut "
            f"mid-generation (error event + [DONE]), {refused} refused with 503 before headers"
        )
    finally:
        endpoint.close()
        serve.shutdown()
    assert endpoint.triton is None
