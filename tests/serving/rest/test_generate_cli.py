"""`kiln generate` against a real HTTP server: a chat model's prompt goes through its chat
template by default (`--chat`/`--no-chat`), `--url` defaults to `kiln serve`'s address, and an
empty answer is warned about."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time

import pytest

from kiln.platform.cli import build_parser, main
from kiln.serving.chat_template import CHATML
from tests.conftest import free_port

PROMPT = "What is the name of Kiln's mascot?"


@contextlib.contextmanager
def http_server(app):
    """`app` on uvicorn in a thread, on a free port of 127.0.0.1; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join()


@pytest.fixture(scope="module")
def chat_endpoint(tiny_model_dir, tmp_path_factory):
    """The tiny model with a chat template (an instruct model's shape), served over HTTP."""
    from kiln.serving.api.protocol import Limits
    from kiln.serving.api.server import create_api
    from kiln.serving.backends.backend import BatchingConfig
    from kiln.serving.backends.local import LocalBackend

    model = tmp_path_factory.mktemp("chat") / "tiny-chat"
    shutil.copytree(tiny_model_dir, model)
    config = model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHATML}))
    backend = LocalBackend(str(model), "tiny-chat", BatchingConfig())
    with http_server(create_api(backend, Limits(max_new_tokens=16))) as url:
        yield url


def _generate(capsys, *argv: str) -> tuple[str, str]:
    assert main(["generate", *argv, "--max-tokens", "8"]) == 0
    captured = capsys.readouterr()
    return captured.out.rstrip("\n"), captured.err


def test_generate_uses_the_chat_template_of_a_chat_model(chat_endpoint, capsys):
    from kiln.serving.client import KilnClient

    with KilnClient(chat_endpoint) as client:
        as_chat = client.chat([{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0)
        as_text = client.complete(PROMPT, max_tokens=8, temperature=0)
    assert as_chat.strip() and as_chat != as_text  # the two routes answer differently here
    out, err = _generate(capsys, PROMPT, "--url", chat_endpoint)
    assert out == as_chat and not err
    out, _ = _generate(capsys, PROMPT, "--url", chat_endpoint, "--stream")
    assert out == as_chat
    out, _ = _generate(capsys, PROMPT, "--url", chat_endpoint, "--no-chat")
    assert out == as_text


def test_generate_warns_on_an_empty_answer(chat_endpoint, capsys):
    from kiln.serving.client import KilnClient

    with KilnClient(chat_endpoint) as client:
        answer = client.chat([{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0)
    out, err = _generate(capsys, PROMPT, "--url", chat_endpoint, "--stop", answer[0])
    assert out == ""
    assert err.strip() == (
        "kiln: warning: the model returned no text (try another prompt or --max-tokens)"
    )


def test_generate_url_defaults_to_the_local_endpoint(monkeypatch):
    monkeypatch.delenv("KILN_URL", raising=False)
    args = build_parser().parse_args(["generate", "hi"])
    serve = build_parser().parse_args(["serve", "model"])
    assert args.url == f"http://{serve.host}:{serve.port}" and args.chat is None
