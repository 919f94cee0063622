"""What ran: the resolved spec, the `--set` overrides, versions, git sha and host of a run.

`run.json` keeps this beside the stages' outcomes, so a run folder alone says which code and
which settings produced it. Versions come from the installed distributions' metadata (no import
of torch or Ray for a pipeline that does not use them).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from kiln.platform.version import __version__

DISTRIBUTIONS = ("torch", "ray", "transformers")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"kiln": __version__, "python": platform.python_version()}
    out.update({d: _version(d) for d in DISTRIBUTIONS})
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(source: Path | None = None) -> dict[str, Any]:
    """The commit the kiln package was loaded from (null outside a git checkout), and whether
    its tracked files differ from that commit."""
    where = source or Path(__file__).resolve().parent.parent  # the kiln package
    sha = _git(["rev-parse", "HEAD"], where)
    if sha is None:
        return {"git_sha": None, "git_dirty": None}
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return {"git_sha": sha, "git_dirty": bool(dirty) if dirty is not None else None}


def host() -> dict[str, Any]:
    """Where the run's driver runs (its pid tells `kiln runs rm` whether a run is still alive)."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "pid": os.getpid()}


def resolved_stages(stages: list, wiring: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Each stage as it ran: type, name, its wired inputs and every config field (defaults too)."""
    return [
        {
            "stage": st.type_name,
            "name": st.name,
            "inputs": wiring.get(st.name, {}),
            "config": st.config.model_dump(mode="json", by_alias=True),
        }
        for st in stages
    ]


def provenance(pipeline) -> dict[str, Any]:
    """The `run.json` fields describing what ran (see the module docstring)."""
    return {
        "spec": {
            "source": pipeline.spec_source,
            "pipeline": pipeline.name,
            "runs_dir": str(pipeline.runs_dir),
            "ray": pipeline.ray.model_dump(mode="json"),
            "stages": resolved_stages(pipeline.stages, pipeline.wiring),
        },
        "overrides": list(pipeline.overrides),
        "versions": versions(),
        **git_state(),
        "host": host(),
    }
