"""Fixtures of the reliability tests: a small disk (the 2-node cluster is tests/two_nodes.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess

import pytest


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
