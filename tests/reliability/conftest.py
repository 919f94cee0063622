"""One 2-node Ray cluster for the reliability tests that need nodes (module-scoped per module
that asks for it; shut down in the finalizer even when a test fails)."""

from __future__ import annotations

import errno
import os

import pytest


@pytest.fixture(scope="module")
def two_nodes():
    from tests.reliability.cluster import TwoNodeCluster

    cluster = TwoNodeCluster(head_cpus=1, worker_cpus=1)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted for the test (root only: skipped where mounting is not allowed),
    unmounted in the finalizer even when the test fails."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


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
