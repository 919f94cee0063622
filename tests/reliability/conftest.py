"""One 2-node Ray cluster shared by every reliability test that needs nodes: built by the first,
shut down after the last (or at the session's end when a test fails); the worker node is
restarted for a test when an earlier one killed it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess

import pytest

_cluster = None


@pytest.fixture
def two_nodes():
    """The shared cluster with both nodes up (the worker node restarted if an earlier test
    left it dead)."""
    global _cluster
    if _cluster is None:
        from tests.reliability.cluster import TwoNodeCluster

        _cluster = TwoNodeCluster(head_cpus=1, worker_cpus=1)
    _cluster.ensure_worker_node()
    return _cluster


# tests that leave the worker node dead: run after the others, which would restart it (~10 s)
LEAVES_NODE_DEAD = ("test_worker_node_lost_mid_curate_gives_identical_corpus",)


def pytest_collection_modifyitems(config, items):
    """The cluster's users keep their slots in the run; the ones that end with the worker node
    dead take the last slots, so no test pays for restarting it."""
    users = [i for i in items if "two_nodes" in getattr(i, "fixturenames", ())]
    slots = [n for n, i in enumerate(items) if i in users]
    last = [i for i in users if i.name in LEAVES_NODE_DEAD]
    for slot, item in zip(slots, [i for i in users if i not in last] + last, strict=True):
        items[slot] = item


def _shutdown_cluster() -> None:
    global _cluster
    if _cluster is not None:
        _cluster, cluster = None, _cluster
        cluster.shutdown()


def pytest_runtest_teardown(item, nextitem):
    """Shut the cluster down after the last test that uses it, not at the end of the suite."""
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    if not any("two_nodes" in getattr(i, "fixturenames", ()) for i in later):
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
