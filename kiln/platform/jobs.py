"""Pipelines as Ray jobs: `kiln submit` uploads the working directory (with the spec) through
Ray's JobSubmissionClient and runs `python -m kiln run SPEC` on the cluster."""

from __future__ import annotations

import secrets
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from kiln.platform.errors import InputError, KilnError
from kiln.platform.pipeline import local_runs_dir

EXCLUDES = [".venv", ".git", "runs", "**/__pycache__", "*.egg-info", ".pytest_cache", "bench/out"]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_WAIT_S = 60.0
UNANSWERED_S = 30.0  # how long `submit` and `wait` ask again a dashboard that drops requests


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except (
        ConnectionError,
        RuntimeError,
        ValueError,
    ) as e:  # refused, not a Ray dashboard, bad URL
        raise KilnError(
            f"--address {address}: cannot reach the Ray dashboard ({str(e).splitlines()[0]})"
        ) from None


def submit(
    spec: str,
    address: str,
    *,
    working_dir: str = ".",
    overrides: list[str] = (),
    runs_dir: str | None = None,
    python: str = "python",
    job_id: str | None = None,
) -> str:
    """Submit a pipeline spec as a Ray job; returns the job id."""

    if runs_dir:
        local_runs_dir(runs_dir)  # a URI would fail on the cluster: say so before submitting
    spec_path = Path(spec).resolve()
    if not spec_path.is_file():
        raise InputError(f"{spec}: spec file not found")
    wd = Path(working_dir).resolve()
    if not wd.is_dir():
        raise InputError(f"--working-dir {working_dir}: not a directory")
    staging = None
    try:
        rel = spec_path.relative_to(wd)
    except ValueError:  # the spec lives outside the working dir: upload it alongside
        staging = Path(tempfile.mkdtemp(prefix="kiln-job-"))
        shutil.copy(spec_path, staging / spec_path.name)
        wd, rel = staging, Path(spec_path.name)
    cmd = [python, "-m", "kiln", "run", str(rel)]
    for o in overrides:
        cmd += ["--set", o]
    if runs_dir:
        cmd += ["--runs-dir", runs_dir]
    client = _client(address)
    # the id is chosen here, so a request sent again after a drop is recognised if the first
    # one was accepted after all
    job_id = job_id or f"kiln_{secrets.token_hex(8)}"
    deadline = time.monotonic() + AGENT_WAIT_S
    dropped_since = None
    try:
        while True:
            try:
                return client.submit_job(
                    entrypoint=shlex.join(cmd),
                    runtime_env={"working_dir": str(wd), "excludes": EXCLUDES},
                    submission_id=job_id,
                    metadata={"kiln_spec": str(rel)},
                )
            except OSError as e:  # dropped mid-request (a busy head node): ask again
                dropped_since = dropped_since or time.monotonic()
                if time.monotonic() - dropped_since > UNANSWERED_S:
                    raise _unreachable(address, e) from None
                time.sleep(1.0)
            except RuntimeError as e:
                if dropped_since is not None and "already exists" in str(e):
                    return job_id  # the dropped request had been accepted
                # A head node that just started answers before its job agent is up.
                if "No available agent" not in str(e) or time.monotonic() > deadline:
                    raise KilnError(
                        f"--address {address}: job not accepted ({str(e).splitlines()[0]})"
                    ) from None
                time.sleep(1.0)
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)


def _unreachable(address: str, e: OSError) -> KilnError:
    """One line for a dashboard that refused or dropped a request (requests raises OSErrors)."""
    detail = str(e).splitlines()[0] if str(e) else type(e).__name__
    return KilnError(f"--address {address}: the Ray dashboard did not answer ({detail[:200]})")


def status(job_id: str, address: str) -> str:
    try:
        return str(_client(address).get_job_status(job_id)).split(".")[-1]
    except OSError as e:
        raise _unreachable(address, e) from None


def logs(job_id: str, address: str) -> str:
    try:
        return _client(address).get_job_logs(job_id)
    except OSError as e:
        raise _unreachable(address, e) from None


def wait(job_id: str, address: str, *, timeout_s: float = 3600, echo=print) -> str:
    """Poll until the job ends, echoing new log lines; returns the final status. A dashboard
    that drops a poll (a busy head node does) is asked again for up to UNANSWERED_S."""
    client = _client(address)
    shown = 0
    deadline = time.monotonic() + timeout_s
    answered = time.monotonic()
    while True:
        try:
            state = str(client.get_job_status(job_id)).split(".")[-1]
            text = client.get_job_logs(job_id)
        except OSError as e:
            if time.monotonic() - answered > UNANSWERED_S:
                raise _unreachable(address, e) from None
            time.sleep(1.0)
            continue
        answered = time.monotonic()
        if len(text) > shown:
            echo(text[shown:].rstrip("\n"))
            shown = len(text)
        if state in TERMINAL:
            return state
        if time.monotonic() > deadline:
            raise KilnError(f"job {job_id}: still {state} after {timeout_s:.0f}s")
        time.sleep(0.5)
