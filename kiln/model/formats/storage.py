"""Where checkpoints live: step folders under a root (local path or fsspec URI), the `latest`
pointer, the `kiln.json` sidecar and keep-last-N pruning. No torch here."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import uuid
from typing import Any

import fsspec

LATEST = "latest"
SIDECAR = "kiln.json"
DCP_METADATA = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def fs_and_path(uri: str):
    return fsspec.core.url_to_fs(uri)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(ckpt_dir: str) -> int | None:
    m = _STEP_DIR.match(ckpt_dir.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def write_text_atomic(uri: str, text: str) -> None:
    """Readers see the old text or the new one, never a torn file."""
    fs, path = fs_and_path(uri)
    if is_local(uri):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    else:  # object stores make a single-object put atomic
        fs.pipe_file(path, text.encode())


def write_json(uri: str, body: dict[str, Any]) -> None:
    write_text_atomic(uri, json.dumps(body, indent=2, default=repr))


def read_json(uri: str) -> dict[str, Any]:
    with fsspec.open(uri, "r") as f:
        return json.load(f)


def is_complete(ckpt_dir: str) -> bool:
    """DCP writes `.metadata` last, on the coordinator, after every rank wrote its shard."""
    fs, path = fs_and_path(ckpt_dir)
    return fs.exists(join(path, DCP_METADATA)) and fs.exists(join(path, SIDECAR))


def latest_checkpoint(root: str) -> str | None:
    """The checkpoint the `latest` pointer names (a complete one), or None."""
    fs, path = fs_and_path(join(root, LATEST))
    if not fs.exists(path):
        return None
    with fs.open(path, "r") as f:
        name = f.read().strip()
    ckpt = join(root, name)
    return ckpt if name and is_complete(ckpt) else None


def set_latest(root: str, ckpt_dir: str) -> None:
    write_text_atomic(join(root, LATEST), ckpt_dir.rstrip("/").rsplit("/", 1)[-1] + "\n")


def step_dirs(root: str) -> list[tuple[int, str]]:
    """All step folders under root (complete or not), oldest first."""
    fs, path = fs_and_path(root)
    if not fs.exists(path):
        return []
    found = []
    for entry in fs.ls(path, detail=False):
        step = step_of(entry)
        if step is not None:
            found.append((step, join(root, entry.rstrip("/").rsplit("/", 1)[-1])))
    return sorted(found)


def remove(uri: str) -> None:
    fs, path = fs_and_path(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def prune(root: str, keep_last: int) -> list[str]:
    """Delete all but the newest `keep_last` complete checkpoints up to `latest`, and unfinished
    folders older than it (left by a crash mid-save). Never touches anything newer than `latest`."""
    latest = latest_checkpoint(root)
    if latest is None:
        return []
    latest_step = step_of(latest)
    older = [(s, d) for s, d in step_dirs(root) if s <= latest_step]
    complete = [d for _, d in older if is_complete(d)]
    keep = set(complete[-keep_last:]) | {latest}
    removed = [d for _, d in older if d not in keep]
    for d in removed:
        remove(d)
    return removed


def write_failure(uri: str, exc: BaseException) -> str:
    """Why writing under `uri` failed, in a few words: "no space left on device" when the error
    (or, as torch's zip writer hides errno, the free space of a local disk) says so."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "errno", None) == errno.ENOSPC or "No space left" in str(seen):
            return "no space left on device"
        seen = seen.__cause__ or seen.__context__
    if is_local(uri):
        _, path = fs_and_path(uri)
        while path and not os.path.exists(path):
            path = os.path.dirname(path)
        if path and shutil.disk_usage(path).free < 1 << 20:
            return f"no space left on device: {shutil.disk_usage(path).free} bytes free"
    first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {first.strip()[:200]}"


def read_failure(exc: BaseException) -> str:
    """A checkpoint that cannot be read, in one line: DCP nests each rank's traceback in its
    message, so name the innermost cause (e.g. a truncated shard) instead."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if not line.startswith(("File ", "Traceback", "^", "~"))]
    last = causes[-1] if causes else type(exc).__name__
    return f"unreadable checkpoint (truncated or corrupt file?): {last[:200]}"
