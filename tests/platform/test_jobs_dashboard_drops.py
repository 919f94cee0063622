"""`kiln submit --wait` / `kiln status` against a dashboard that drops requests (a busy head node
does): polling rides out short drops, a dashboard that stays silent gives one line."""

from __future__ import annotations

import pytest
import ray

from kiln.platform import jobs
from kiln.platform.errors import KilnError
from tests.http_stub import JsonHandler, serving


class Dashboard(JsonHandler):
    """Answers Ray's version check; drops the first `drops` job polls, then says SUCCEEDED."""

    drops = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/api/version":
            return self.send_json({"version": "4", "ray_version": ray.__version__})
        if type(self).drops != 0:
            type(self).drops -= 1
            self.connection.shutdown(2)  # no answer at all: the connection just ends
            return None
        if self.path.endswith("/logs"):
            return self.send_json({"logs": "step 1\n"})
        job = {"type": "SUBMISSION", "submission_id": "j", "entrypoint": "x"}
        return self.send_json({**job, "status": "SUCCEEDED"})


@pytest.fixture
def dashboard():
    with serving(Dashboard) as url:
        yield url


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
