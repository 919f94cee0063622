"""`kiln submit --wait` / `kiln status` against a dashboard that drops requests (a busy head node
does): polling rides out short drops, a dashboard that stays silent gives one line."""

from __future__ import annotations

import json
from typing import ClassVar

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


class AcceptingDashboard(JsonHandler):
    """Accepts a job submission but drops the connection before answering, the first time;
    a second submission of the same id is refused as Ray's job head refuses it."""

    accepted: ClassVar[list[str]] = []
    posts = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/api/version":
            return self.send_json({"version": "4", "ray_version": ray.__version__})
        return self.send_json({})  # the working-dir package "exists": no upload

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts += 1
        job = body["submission_id"]
        if job in self.accepted:
            message = f"Job with submission_id {job} already exists. Please use a different one."
            return self.send_json({"detail": message}, code=400)
        self.accepted.append(job)
        if type(self).posts == 1:
            self.connection.shutdown(2)  # accepted, but the answer never comes
            return None
        return self.send_json({"job_id": job, "submission_id": job})


def test_submit_asks_again_after_a_drop_and_takes_the_accepted_job(tmp_path):
    (tmp_path / "spec.yaml").write_text("pipeline: p\nstages: []\n")
    with serving(AcceptingDashboard) as url:
        job_id = jobs.submit(str(tmp_path / "spec.yaml"), url, working_dir=str(tmp_path))
    assert AcceptingDashboard.posts == 2 and AcceptingDashboard.accepted == [job_id]
    assert job_id.startswith("kiln_")
