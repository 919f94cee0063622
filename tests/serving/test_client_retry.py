"""KilnClient's retry budget against a real HTTP server that is 'restarting' (503 + Retry-After)
for a while: the default budget rides out a restart longer than a few retries would, a short
budget gives up at its deadline with the server's answer, a verdict (400) is never retried, and
a stream refused before it starts is retried."""

from __future__ import annotations

import json
import time

import pytest

from kiln.serving.client import KilnClient
from tests.http_stub import JsonHandler, serving


class _Restarting(JsonHandler):
    down_until = 0.0
    down_for = 0.0  # seconds down from the first request on (a deadline set before it can pass)
    status_when_up = 200
    seen = 0

    def _down(self) -> bool:
        cls = type(self)
        if cls.down_for and not cls.down_until:
            cls.down_until = time.monotonic() + cls.down_for
        return time.monotonic() < cls.down_until

    def do_POST(self):  # noqa: N802 (http.server's name)
        type(self).seen += 1
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        down = self._down()
        if request.get("stream") and not down:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in ({"choices": [{"text": "Par"}]}, {"choices": [{"text": "is"}]}):
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        if down:
            code, body, extra = 503, {"error": {"message": "restarting"}}, {"Retry-After": "1"}
        elif self.status_when_up == 200:
            code, body, extra = 200, {"choices": [{"text": "Paris"}]}, {}
        else:
            code, body, extra = self.status_when_up, {"error": {"message": "bad field"}}, {}
        self.send_json(body, code, extra)


@pytest.fixture
def server():
    _Restarting.seen, _Restarting.status_when_up = 0, 200
    _Restarting.down_for, _Restarting.down_until = 0.0, 0.0
    with serving(_Restarting) as url:
        yield _Restarting, url


@pytest.mark.slow  # waits out a ~5 s restart: `make test` runs it, test-fast does not
def test_default_budget_rides_out_a_restart_longer_than_three_retries(server):
    handler, url = server
    handler.down_for = 4.5  # > 3 retries x Retry-After 1 s, timed from the first request
    with KilnClient(url) as client:
        assert client.complete("capital of France?") == "Paris"
        assert 4 <= client.retried <= 6, client.retried


def test_short_budget_gives_up_at_its_deadline_with_the_servers_answer(server):
    handler, url = server
    handler.down_until = time.monotonic() + 60
    with KilnClient(url, retry_for=1.5) as client:
        started = time.monotonic()
        with pytest.raises(Exception, match="restarting"):
            client.complete("x")
        assert time.monotonic() - started < 3.5
    with KilnClient(url, retries=1) as client:
        with pytest.raises(Exception, match="restarting"):
            client.complete("x")
        assert client.retried == 1


def test_a_verdict_is_not_retried(server):
    handler, url = server
    handler.down_until, handler.status_when_up = 0.0, 400
    with KilnClient(url) as client:
        with pytest.raises(Exception, match="bad field"):
            client.complete("x")
        assert client.retried == 0 and handler.seen == 1


def test_a_stream_is_retried_until_it_starts(server):
    """A 503 before the stream's headers (a Triton server down before the first token) is
    retried like a completion; the stream then comes through whole."""
    handler, url = server
    handler.down_for = 0.5  # < Retry-After 1 s: the first request is refused, the retry is not
    with KilnClient(url) as client:
        assert list(client.stream("capital of France?")) == ["Par", "is"]
        assert client.retried == 1 and handler.seen == 2
