"""One 2-node Ray cluster shared by every reliability test that needs nodes: built by the first,
shut down after the last (or at the session's end when a test fails); rebuilt for a test when
an earlier one killed a node."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess

import pytest

_cluster = None


@pytest.fixture
def two_nodes():
    """The shared cluster with both nodes up: a fresh one when an earlier test killed a node.
    (On a cluster whose worker node was killed and restarted, Ray Data actors created by a new
    driver were destroyed as soon as registered, "all references removed": Ray's, seen in
    test_curate_faults after test_elastic; Ray Train and jobs ran on such a cluster fine.)"""
    global _cluster
    if _cluster is not None and _cluster.node_killed:
        _shutdown_cluster()
    if _cluster is None:
        from tests.reliability.cluster import TwoNodeCluster

        _cluster = TwoNodeCluster(head_cpus=1, worker_cpus=1)
    return _cluster


def _shutdown_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster, cluster = None, _cluster
        cluster.shutdown()


def pytest_runtest_teardown(item, nextitem):
    """Shut the cluster down after the last test that uses it, not at the end of the suite: its
    users run back to back (tests/conftest.py orders them), on one xdist worker, whose
    `session.items` is the whole collection, so the next item is what tells."""
    if nextitem is None or "two_nodes" not in getattr(nextitem, "fixturenames", ()):
        _shutdown_cluster()


def pytest_sessionfinish(session, exitstatus):
    _shutdown_cluster()


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A tmpfs of `size` mounted at `path` (root only: the test is skipped where mounting is not
    allowed), unmounted on exit even when the test fails."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs for the test."""
    with tmpfs(tmp_path / "disk", "16m") as path:
        yield path


def fill_disk(path) -> None:
    """Write zeros into `path/filler` until the filesystem is full (unbuffered writes)."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
