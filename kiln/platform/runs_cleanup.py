"""Removing runs: `kiln runs rm RUN...` and `kiln runs gc --keep N [PIPELINE]`.

A run whose driver is still alive is never removed without `--force`. Neither is a run whose
stage folders a kept run reuses as its cache (`cached_from` in that run's `run.json`): its
report and outputs point there. Sizes count each file once, however many hard links it has
(exports hard-link weights they did not change).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from kiln.platform.errors import InputError
from kiln.platform.runs import RunInfo, list_runs


def _record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def is_alive(run_dir: Path) -> bool:
    """Whether the run is still going: `running` in run.json and its driver process alive (a
    driver on another host, or one that recorded no pid, counts as alive)."""
    record = _record(run_dir)
    if record.get("status") != "running":
        return False
    host = record.get("host") or {}
    pid = host.get("pid")
    if not isinstance(pid, int) or host.get("hostname") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False  # the driver died without recording an outcome
    except PermissionError:
        return True
    return True


def cache_sources(run_dir: Path) -> set[Path]:
    """The other run folders whose stage outputs this run reuses (cached stages)."""
    out = set()
    for entry in (_record(run_dir).get("stages") or {}).values():
        source = entry.get("cached_from")
        if source:
            out.add(Path(source).resolve().parent)
    return out - {run_dir.resolve()}


def folder_bytes(paths: list[Path]) -> int:
    """Bytes under the folders, each file (inode) counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def resolve_run(ref: str, runs_dir: Path) -> Path:
    """A run folder from a path or `<pipeline>/<run-id>` under the runs folder."""
    for candidate in (Path(ref), runs_dir / ref):
        if (candidate / "run.json").is_file():
            return candidate.resolve()
    raise InputError(f"{ref}: not a run folder (no run.json here or under {runs_dir})")


@dataclass
class Removal:
    removed: list[Path]
    skipped: list[tuple[Path, str]]  # (run, why it stays)
    bytes_freed: int


def remove_runs(
    runs: list[Path], runs_dir: Path, force: bool = False, dry_run: bool = False
) -> Removal:
    """Delete these run folders unless alive or reused by a run that stays (`force`: anyway)."""
    targets = {r.resolve() for r in runs}
    users: dict[Path, list[Path]] = {}
    for info in list_runs(runs_dir):
        here = info.path.resolve()
        if here in targets:
            continue
        for source in cache_sources(here):
            users.setdefault(source, []).append(here)
    removed, skipped = [], []
    for run in sorted(targets):
        if not force and is_alive(run):
            skipped.append((run, "running (--force removes it anyway)"))
        elif not force and run in users:
            names = ", ".join(str(u.relative_to(runs_dir.resolve())) for u in users[run])
            skipped.append((run, f"stages cached from it by {names} (--force removes it anyway)"))
        else:
            removed.append(run)
    freed = folder_bytes(removed)
    if not dry_run:
        for run in removed:
            shutil.rmtree(run)
    return Removal(removed, skipped, freed)


def runs_to_collect(runs: list[RunInfo], keep: int) -> list[Path]:
    """All but the newest `keep` runs of each pipeline (`runs` newest first, as list_runs)."""
    seen: dict[str, int] = {}
    out = []
    for r in runs:
        seen[r.pipeline] = seen.get(r.pipeline, 0) + 1
        if seen[r.pipeline] > keep:
            out.append(r.path)
    return out


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def format_removal(result: Removal, runs_dir: Path, dry_run: bool) -> str:
    def name(p: Path) -> str:
        try:
            return str(p.relative_to(runs_dir.resolve()))
        except ValueError:
            return str(p)

    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb} {name(p)}" for p in result.removed]
    lines += [f"kept {name(p)}: {why}" for p, why in result.skipped]
    lines.append(f"{verb} {len(result.removed)} run(s), {human_bytes(result.bytes_freed)}")
    return "\n".join(lines)
