"""What a SIGKILLed kiln leaves (tritonserver work folders, python-backend shm segments) is
removed by the next start; what a live kiln process owns is kept."""

from __future__ import annotations

import os
import subprocess
import sys

from kiln.serving.triton.stale import clean_stale, shm_prefix, workdir_prefix


def test_leftovers_of_a_killed_process_are_removed_live_ones_kept(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    victim.kill()  # SIGKILL: no cleanup of its own ran
    victim.wait()
    dead, live = victim.pid, os.getpid()
    tmp, shm = tmp_path / "tmp", tmp_path / "shm"
    for d in (tmp, shm):
        d.mkdir()
    (tmp / f"kiln-triton-{dead}-abc").mkdir()
    (tmp / f"kiln-triton-{dead}-abc" / "tritonserver.log").write_text("...")
    (shm / f"kiln{dead}_9f3a21_model_0").write_bytes(b"\0" * 64)
    mine = [tmp / f"{workdir_prefix()}xyz", shm / f"{shm_prefix('1a2b3c')}_model_0"]
    mine[0].mkdir()
    mine[1].write_bytes(b"\0")
    other = tmp / "kiln-triton-notapid"  # not ours to judge
    other.mkdir()

    removed = clean_stale(str(tmp), str(shm))

    assert sorted(removed) == sorted(
        [str(tmp / f"kiln-triton-{dead}-abc"), str(shm / f"kiln{dead}_9f3a21_model_0")]
    )
    assert all(p.exists() for p in [*mine, other])
    assert workdir_prefix() == f"kiln-triton-{live}-"
