"""`kiln submit --wait` / `kiln status` against a dashboard that drops requests (a busy head node
does): polling rides out short drops, a dashboard that stays silent gives one line."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import ray

from kiln.platform import jobs
from kiln.platform.errors import KilnError


class Dashboard(BaseHTTPRequestHandler):
    """Answers Ray's version check; drops the first `drops` job polls, then says SUCCEEDED."""

    drops = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/api/version":
            return self._json({"version": "4", "ray_version": ray.__version__, "ray_commit": "x"})
        if type(self).drops != 0:
            type(self).drops -= 1
            self.connection.shutdown(2)  # no answer at all: the connection just ends
            return None
        if self.path.endswith("/logs"):
            return self._json({"logs": "step 1\n"})
        return self._json(
            {"type": "SUBMISSION", "submission_id": "j", "entrypoint": "x", "status": "SUCCEEDED"}
        )

    def _json(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_wait_rides_out_dropped_polls(dashboard):
    Dashboard.drops = 2
    lines = []
    assert jobs.wait("j", dashboard, echo=lines.append) == "SUCCEEDED"
    assert lines == ["step 1"] and Dashboard.drops == 0


def test_a_silent_dashboard_is_one_line_not_a_traceback(dashboard, monkeypatch):
    monkeypatch.setattr(jobs, "UNANSWERED_S", 0.5)
    Dashboard.drops = -1  # drops every poll
    with pytest.raises(KilnError) as failed:
        jobs.wait("j", dashboard, echo=print)
    message = str(failed.value)
    assert message.startswith(f"--address {dashboard}: the Ray dashboard did not answer")
    assert "\n" not in message
    with pytest.raises(KilnError, match="did not answer"):
        jobs.status("j", dashboard)
