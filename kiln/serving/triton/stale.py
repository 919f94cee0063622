"""Leftovers of a kiln process that was SIGKILLed (no `finally` ran): its tritonserver work
folders (`<tmp>/kiln-triton-<pid>-*`) and the python backend's shared-memory segments
(`/dev/shm/kiln<pid>_*`). The next server start removes those whose owning process is gone."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

log = logging.getLogger("kiln")
WORKDIR_PREFIX = "kiln-triton-"
SHM_DIR = "/dev/shm"
_WORKDIR = re.compile(rf"^{WORKDIR_PREFIX}(\d+)-")
_SHM = re.compile(r"^kiln(\d+)_")


def workdir_prefix() -> str:
    """mkdtemp prefix naming this process, so a later start can tell a stale folder."""
    return f"{WORKDIR_PREFIX}{os.getpid()}-"


def shm_prefix(suffix: str) -> str:
    return f"kiln{os.getpid()}_{suffix}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale(tmp_dir: str | None = None, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove work folders and shm segments of dead kiln processes; returns what was removed."""
    removed = []
    for folder, pattern in ((tmp_dir or tempfile.gettempdir(), _WORKDIR), (shm_dir, _SHM)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = pattern.match(name)
            if not m or _alive(int(m.group(1))):
                continue
            path = os.path.join(folder, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
                removed.append(path)
            except OSError as exc:
                log.debug("could not remove stale %s: %s", path, exc)
    if removed:
        log.info("removed %d leftovers of killed kiln processes", len(removed))
    return removed
