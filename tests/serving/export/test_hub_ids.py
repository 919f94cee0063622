"""`kiln import-hf org/name` (and `org/name@revision`) through huggingface_hub against a stub Hub:
a real HTTP server on 127.0.0.1 answering the requests snapshot_download makes (revision info,
the file tree, HEAD and GET of each file). Nothing leaves the machine: HF_ENDPOINT points here."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from kiln.platform.cli import main
from tests.http_stub import JsonHandler, serving

REPO = "kiln-test/tiny"
COMMITS = {"main": "a" * 40, "v1": "b" * 40}


def stub_hub(folder: str, requests: list[str]):
    """A handler class serving `folder`'s files as model REPO at every revision in COMMITS."""
    files = {f.name: f.read_bytes() for f in sorted(Path(folder).iterdir())}

    class Hub(JsonHandler):
        def send_bytes(self, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(200)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        def answer(self) -> None:
            path = unquote(urlparse(self.path).path)
            requests.append(f"{self.command} {path}")
            api, resolve = f"/api/models/{REPO}/", f"/{REPO}/resolve/"
            if path.startswith(api + "revision/"):
                revision = path[len(api + "revision/") :]
                if revision not in COMMITS:
                    return self.send_json(
                        {"error": "no revision"}, 404, {"X-Error-Code": "RevisionNotFound"}
                    )
                return self.send_json({"id": REPO, "sha": COMMITS[revision], "siblings": []})
            if path.startswith(api + "tree/"):
                tree = [
                    {"type": "file", "oid": hashlib.sha1(b).hexdigest(), "size": len(b), "path": f}
                    for f, b in files.items()
                ]
                return self.send_json(tree)
            if path.startswith(resolve):
                commit, _, name = path[len(resolve) :].partition("/")
                body = files[name]
                etag = f'"{hashlib.sha1(body).hexdigest()}"'
                return self.send_bytes(body, {"X-Repo-Commit": commit, "ETag": etag})
            self.send_json({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})

        do_GET = do_HEAD = answer

    return Hub


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from tests.serving.rest.tiny_model import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("hub") / "tiny"))


@pytest.fixture
def hub(model_dir, tmp_path, monkeypatch):
    """(base URL, requests seen); HF_HOME is this test's own cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    requests: list[str] = []
    with serving(stub_hub(model_dir, requests)) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield url, requests


def _import(capsys, *argv: str) -> tuple[int, str]:
    code = main(["import-hf", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, (err[-1] if err else "")


def test_a_hub_id_imports_then_comes_from_the_cache(hub, model_dir, tmp_path, monkeypatch, capsys):
    from kiln.model.formats.weights import read_hf_dir, read_weights

    url, requests = hub
    assert _import(capsys, REPO, "--out", str(tmp_path / "ckpt"))[0] == 0
    assert f"GET /api/models/{REPO}/revision/main" in requests
    assert not any("kiln_export.json" in r for r in requests)  # only what a model needs
    _, _, source = read_hf_dir(model_dir)
    _, _, imported = read_weights(str(tmp_path / "ckpt"))
    assert imported.keys() == source.keys()
    assert all((imported[k] == source[k]).all() for k in source)
    assert json.loads((tmp_path / "ckpt" / "tokenizer.json").read_text())

    requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _import(capsys, REPO, "--out", str(tmp_path / "again"))[0] == 0
    assert requests == []  # offline: the cache alone


def test_a_revision_is_pinned(hub, tmp_path, capsys):
    from kiln.model.formats.hub import local_model

    _, requests = hub
    assert _import(capsys, REPO, "--revision", "v1", "--out", str(tmp_path / "ckpt"))[0] == 0
    assert f"GET /api/models/{REPO}/revision/v1" in requests
    assert any(r.startswith(f"GET /{REPO}/resolve/{COMMITS['v1']}/") for r in requests)
    folder = local_model(f"{REPO}@v1")  # the YAML form (`base:`, `source:`)
    assert folder.endswith(COMMITS["v1"]) and os.path.isfile(os.path.join(folder, "config.json"))
    code, err = _import(capsys, REPO, "--revision", "v9", "--out", str(tmp_path / "x"))
    assert code == 2 and err == f"kiln: error: {REPO}: no revision 'v9' on {hub[0]}"


def test_errors_are_one_line(hub, tmp_path, monkeypatch, capsys):
    url, _ = hub
    code, err = _import(capsys, "kiln-test/nope", "--out", str(tmp_path / "a"))
    assert code == 2 and err == (
        f"kiln: error: kiln-test/nope: no such local folder, and no model 'kiln-test/nope' on "
        f"{url} (a private one needs HF_TOKEN)"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = _import(capsys, REPO, "--out", str(tmp_path / "b"))
    assert code == 2 and err == (
        f"kiln: error: {REPO}: not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    )
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with serving(JsonHandler) as gone:
        pass  # its port is closed now: a Hub that cannot be reached
    monkeypatch.setenv("HF_ENDPOINT", gone)
    code, err = _import(capsys, REPO, "--out", str(tmp_path / "c"))
    assert code == 2 and err == (
        f"kiln: error: {REPO}: not in the Hugging Face cache and {gone} could not be reached "
        "(set HF_ENDPOINT for a mirror)"
    )
