"""The exported Triton repository in the real tritonserver (nvidia-pytriton's), HTTP and gRPC."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from kiln.engine.generator import Generator, SamplingParams
from kiln.serving.export.triton import export_triton
from kiln.serving.triton.server import TritonServer
from kiln.serving.triton.stubs import stub_pids
from tests.conftest import free_port
from tests.engine.tiny import tiny_generator, train_tokenizer

pytestmark = pytest.mark.slow  # tritonserver and python-backend stub processes

PROMPTS = ["the quick brown fox", "hello world"]
# the model's own template (not ChatML): the Triton model must render `messages` with it
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """One repository, two models: `tiny` (dynamic batching) and `tiny_stream` (decoupled)."""
    root = tmp_path_factory.mktemp("triton")
    gen = tiny_generator(
        "mixtral", train_tokenizer()
    )  # MoE: the vendored runtime must carry moe.py
    repo = str(root / "repo")
    export_triton(gen, repo, model_name="tiny", max_batch_size=4, torch_threads=1)
    config_file = Path(repo, "tiny", "1", "hf", "tokenizer_config.json")
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    export_triton(
        os.path.join(repo, "tiny", "1", "hf"),
        repo,
        model_name="tiny_stream",
        decoupled=True,
        torch_threads=1,
    )
    return repo


@pytest.fixture(scope="module")
def reference(repo):
    """kiln's own generate over the same exported weights."""
    return Generator.load(os.path.join(repo, "tiny", "1", "hf"))


@pytest.fixture(scope="module")
def server(repo):
    with TritonServer(repo) as s:
        yield s
    assert s.process is None


def _http_inputs(client_module, prompts, max_tokens, **fields):
    inputs = []

    def add(name, values, dtype, triton_type):
        t = client_module.InferInput(name, [len(values), 1], triton_type)
        t.set_data_from_numpy(np.array(values, dtype=dtype).reshape(-1, 1))
        inputs.append(t)

    add("text_input", [p.encode() for p in prompts], np.object_, "BYTES")
    add("max_tokens", [max_tokens] * len(prompts), np.int32, "INT32")
    for name, (value, dtype, triton_type) in fields.items():
        add(name, [value] * len(prompts), dtype, triton_type)
    return inputs


def _texts(result) -> list[str]:
    return [v.decode() for v in result.as_numpy("text_output").reshape(-1)]


def test_repository_layout_and_config(repo):
    model = os.path.join(repo, "tiny")
    config = Path(model, "config.pbtxt").read_text()
    for needle in (
        'backend: "python"',
        "max_batch_size: 4",
        "dynamic_batching",
        "KIND_CPU",
        '"text_input"',
        '"messages"',
        "TYPE_STRING",
        '"text_output"',
        '"max_tokens"',
        '"temperature"',
        '"top_k"',
        '"top_p"',
        '"seed"',
        '"stream"',
        "decoupled: false",
    ):
        assert needle in config
    assert "decoupled: true" in Path(repo, "tiny_stream", "config.pbtxt").read_text()
    runtime = os.path.join(model, "1", "runtime", "kiln")
    assert os.path.exists(os.path.join(runtime, "model", "moe.py"))
    assert not os.path.exists(os.path.join(runtime, "platform", "runtime.py"))  # no Ray in the repo
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert os.path.exists(os.path.join(model, "1", "hf", name))
    # the vendored runtime is self-contained: it generates without Ray (or kiln's checkout)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import kiln; "
        "from kiln.engine.generator import Generator; "
        "assert kiln.__file__.startswith(sys.argv[1]), kiln.__file__; "
        "g = Generator.load(sys.argv[2]); g.generate(['hi']); "
        "assert not any(m.split('.')[0] in ('ray', 'pandas') for m in sys.modules), 'ray imported'"
    )
    runtime_dir, hf_dir = os.path.join(model, "1", "runtime"), os.path.join(model, "1", "hf")
    subprocess.run([sys.executable, "-c", script, runtime_dir, hf_dir], check=True, cwd="/")


def test_server_and_stubs_run_in_kilns_session_in_their_own_process_group(server):
    """A new session would be a new scheduler autogroup, where beside a CPU hog a stub's health
    thread waited up to 2 s for a CPU and Triton deadlocked the start (docs/reliability.md);
    its own process group is what lets kiln killpg the server with its stubs."""
    pid = server.process.pid
    stubs = stub_pids(pid)
    assert stubs, "no python-backend stub under the server"
    # absent without CONFIG_SCHED_AUTOGROUP; empty for a task in a cpu cgroup other than the
    # root (a container's), which autogroups do not apply to
    autogroup = Path("/proc/self/autogroup")
    for p in [pid, *stubs]:
        assert os.getsid(p) == os.getsid(0)
        assert os.getpgid(p) == pid
        if autogroup.exists():
            assert Path(f"/proc/{p}/autogroup").read_text() == autogroup.read_text()


def test_http_returns_kilns_greedy_text(server, reference):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    expected = [c.text for c in reference.generate(PROMPTS, SamplingParams(max_new_tokens=12))]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_model_ready("tiny") and client.is_model_ready("tiny_stream")
        result = client.infer(
            "tiny", _http_inputs(httpclient, PROMPTS, 12)
        )  # two rows, one request
        assert _texts(result) == expected
        assert result.as_numpy("completion_tokens").reshape(-1).tolist() == [
            c.completion_tokens
            for c in reference.generate(PROMPTS, SamplingParams(max_new_tokens=12))
        ]
        # concurrent single-row requests: dynamic batching may group them; the text must not change
        pending = [
            client.async_infer("tiny", _http_inputs(httpclient, [p], 12)) for p in PROMPTS * 2
        ]
        assert [_texts(p.get_result())[0] for p in pending] == expected * 2
        # a bad request gets an error of its own; the server keeps answering
        with pytest.raises(InferenceServerException, match="limit"):
            client.infer("tiny", _http_inputs(httpclient, PROMPTS[:1], 100_000))
        assert (
            _texts(client.infer("tiny", _http_inputs(httpclient, PROMPTS[:1], 12))) == expected[:1]
        )
    finally:
        client.close()
    # Triton's generate extension, as plain JSON
    body = json.dumps({"text_input": PROMPTS[0], "max_tokens": 12}).encode()
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/tiny/generate", data=body, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.load(r)["text_output"] == expected[0]


def test_grpc_returns_kilns_greedy_and_seeded_text(server, reference):
    import tritonclient.grpc as grpcclient

    greedy = reference.generate([PROMPTS[1]], SamplingParams(max_new_tokens=12))[0].text
    seeded_params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=40, top_p=0.9, seed=5)
    seeded = reference.generate([PROMPTS[1]], seeded_params)[0].text
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert _texts(client.infer("tiny", _http_inputs(grpcclient, [PROMPTS[1]], 12))) == [greedy]
        sampling = {
            "temperature": (0.9, np.float32, "FP32"),
            "top_k": (40, np.int32, "INT32"),
            "top_p": (0.9, np.float32, "FP32"),
            "seed": (5, np.int64, "INT64"),
        }
        assert _texts(
            client.infer("tiny", _http_inputs(grpcclient, [PROMPTS[1]], 12, **sampling))
        ) == [seeded]
    finally:
        client.close()


def test_grpc_streaming_from_the_decoupled_model(server, reference):
    import tritonclient.grpc as grpcclient

    expected = reference.generate([PROMPTS[0]], SamplingParams(max_new_tokens=12))[0].text
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inputs = _http_inputs(grpcclient, [PROMPTS[0]], 12, stream=(True, np.bool_, "BOOL"))
        client.async_stream_infer("tiny_stream", inputs, enable_empty_final_response=True)
        deltas = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            if result.as_numpy("text_output") is not None:
                deltas.append(_texts(result)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    finally:
        client.close()
    assert len(deltas) > 1
    assert "".join(deltas) == expected


def _children(pid: int) -> set[int]:
    """Child processes of `pid` (Linux /proc)."""
    found: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            found |= {int(c) for c in f.read().split()}
    return found


def _ready(http_port: int, deadline: float) -> bool:
    """Poll tritonserver's readiness until `deadline` (monotonic)."""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2
            ) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kiln_triton_up_restarts_a_dead_server_and_stops_on_sigint(tmp_path):
    """`kiln triton up` started with SIGINT ignored (a non-interactive shell's background job):
    its tritonserver SIGKILLed is restarted on the same port with one console line, answering
    again within 3x the first start's time; SIGINT then stops it within 10 s, server reaped.
    An empty model repository: the server starts in a second (serving a model is tested above)."""
    http_port = free_port()
    cmd = [sys.executable, "-m", "kiln", "triton", "up", str(tmp_path)]
    started = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "--http-port", str(http_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True)
    reader.start()

    def expect(text: str, deadline: float) -> str:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                assert proc.poll() is None, f"kiln triton up exited with {proc.returncode}"
                continue
            if text in line:
                return line
        raise AssertionError(f"no {text!r} line in time")

    servers: set[int] = set()
    try:
        line = expect("ready", started + 180)
        startup_s = time.monotonic() - started
        assert f"127.0.0.1:{http_port}" in line
        (first,) = servers = _children(proc.pid)
        assert f"(pid {first})" in line
        os.kill(first, signal.SIGKILL)
        killed = time.monotonic()
        line = expect("restarting", killed + 5)  # the supervisor polls every 0.2 s
        assert f"(pid {first}) exited with code -9; restarting in 0.5 s" in line
        # exit seen (<= 0.2 s), backoff 0.5 s, then a start like the first: 3x its time, for load
        assert _ready(http_port, killed + 0.7 + 3 * startup_s), "not restarted in time"
        (second,) = _children(proc.pid)
        servers.add(second)
        assert second != first
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not os.path.exists(f"/proc/{second}")  # stopped and reaped, not orphaned
        reader.join(timeout=5)  # the output to its end
        rest = []
        while not lines.empty():
            rest.append(lines.get())
        assert [x for x in rest if x.strip()][-1].strip() == "tritonserver stopped", rest
        print(f"started in {startup_s:.1f} s; restarted in {time.monotonic() - killed:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in servers:  # their own sessions: a server left behind goes with its stubs
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_chat_messages_are_rendered_with_the_models_template(server, reference):
    """`messages` rows (JSON) come back as kiln's greedy completion of the rendered prompt."""
    import tritonclient.http as httpclient

    from kiln.serving.chat_template import render_chat

    chats = [
        [{"role": "user", "content": "the quick brown fox"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
    ]
    prompts = [render_chat(c, CHAT_TEMPLATE, {}) for c in chats]
    assert prompts[0] == "user: the quick brown fox\nassistant:"
    expected = [c.text for c in reference.generate(prompts, SamplingParams(max_new_tokens=10))]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        messages = httpclient.InferInput("messages", [2, 1], "BYTES")
        messages.set_data_from_numpy(
            np.array([json.dumps(c).encode() for c in chats], dtype=np.object_).reshape(-1, 1)
        )
        max_tokens = httpclient.InferInput("max_tokens", [2, 1], "INT32")
        max_tokens.set_data_from_numpy(np.array([[10], [10]], dtype=np.int32))
        assert _texts(client.infer("tiny", [messages, max_tokens])) == expected
    finally:
        client.close()


def test_decoupled_model_batches_at_every_step(server, reference):
    """Behind Triton the engine batches per decoding step: a short request sent after a long
    one joins the running batch and finishes first, each with kiln's greedy text."""
    import tritonclient.grpc as grpcclient

    lengths = {"long": 70, "short": 2}
    expected = {
        k: reference.generate([PROMPTS[1]], SamplingParams(max_new_tokens=n))[0].text
        for k, n in lengths.items()
    }
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for name, n in lengths.items():
            client.async_stream_infer(
                "tiny_stream", _http_inputs(grpcclient, [PROMPTS[1]], n), request_id=name
            )
        order, texts = [], {}
        while len(order) < 2:
            result, error = responses.get(timeout=60)
            assert error is None, error
            name = result.get_response().id
            order.append(name)
            texts[name] = _texts(result)[0]
        client.stop_stream()
    finally:
        client.close()
    assert order == ["short", "long"]
    assert texts == expected


def _with_initialize_prelude(repo: str, tmp_path: Path, prelude: str) -> str:
    """A copy of `repo`'s `tiny` model whose `initialize` runs `prelude` (indented code) first:
    how the tests below make a server start hang, crash or deadlock."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(os.path.join(repo, "tiny"), copy / "tiny")
    model_py = copy / "tiny" / "1" / "model.py"
    head = "    def initialize(self, args):\n"
    model_py.write_text(model_py.read_text().replace(head, head + prelude, 1))
    return str(copy)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_start_that_times_out_shows_where_initialize_hung(repo, server, tmp_path):
    """A model whose `initialize` never returns: the timeout's error carries the stub's stacks
    (kiln's model.py registers faulthandler on SIGUSR1, TritonServer signals its stubs). The
    timeout is twice what this machine took to start the module's server (two models, this one
    of them), so the stub is in `initialize` by then even on a loaded machine."""
    from kiln.platform.errors import KilnError

    hang = "        import time\n        time.sleep(3600)\n"
    hung = _with_initialize_prelude(repo, tmp_path, hang)
    timeout_s = round(max(5.0, 2 * server.launch_s))
    hung_server = TritonServer(hung, startup_timeout_s=timeout_s)
    with pytest.raises(KilnError, match=f"not ready after {timeout_s} s") as failed:
        hung_server.start()
    assert "in initialize" in str(failed.value), str(failed.value)[-2000:]
    assert hung_server.process is None  # the server and its stubs are gone


def test_a_server_that_dies_of_a_signal_while_starting_is_started_again(repo, tmp_path, caplog):
    """The python backend can abort while a stub starts on a loaded machine: here the stub
    kills its server with SIGABRT the first time. `start` tries again, with one warning."""
    crashed = tmp_path / "crashed-once"
    abort_once = (
        f"        if not os.path.exists({str(crashed)!r}):\n"
        f"            open({str(crashed)!r}, 'w').close()\n"
        "            os.kill(os.getppid(), signal.SIGABRT)\n"
    )
    flaky = _with_initialize_prelude(repo, tmp_path, abort_once)
    with caplog.at_level("WARNING", logger="kiln.triton"), TritonServer(flaky) as server:
        assert _ready(server.http_port, time.monotonic() + 5)
    assert crashed.exists()
    warnings = [r.getMessage() for r in caplog.records if r.name == "kiln.triton"]
    assert warnings == [
        "tritonserver died of signal 6 while starting (attempt 1 of 5): starting it again"
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_start_deadlocked_on_a_starved_stub_is_started_again(repo, tmp_path, caplog):
    """The python backend's deadlock on a loaded machine, made on purpose: the stub is stopped
    for 3 s inside `initialize` (its health thread misses the 1 s the server allows), so the
    server judges it unhealthy and waits for it to exit, for good. kiln sees the server blocked
    in waitpid, kills it and starts it again, with one warning."""
    from kiln.serving.triton.stubs import STUB_WAIT_DEADLOCK_S

    stopped = tmp_path / "stopped-once"
    stop_once = (
        f"        if not os.path.exists({str(stopped)!r}):\n"
        f"            open({str(stopped)!r}, 'w').close()\n"
        "            import subprocess, time\n"
        "            me = os.getpid()\n"
        "            subprocess.Popen(['sh', '-c', f'kill -STOP {me}; sleep 3; kill -CONT {me}'])\n"
        "            time.sleep(1)\n"
    )
    starved = _with_initialize_prelude(repo, tmp_path, stop_once)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="kiln.triton"), TritonServer(starved) as server:
        assert _ready(server.http_port, time.monotonic() + 5)
    assert stopped.exists()
    assert time.monotonic() - started > STUB_WAIT_DEADLOCK_S
    warnings = [r.getMessage() for r in caplog.records if r.name == "kiln.triton"]
    assert warnings == [
        "tritonserver deadlocked on a python-backend stub while starting (attempt 1 of 5): "
        "starting it again"
    ]
