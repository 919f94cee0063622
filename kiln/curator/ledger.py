"""A record of finished work units (a curate read task, a generate batch) in a work folder that
survives a killed run: a unit's outputs are written first and its record last (an atomic
rename), so a rerun skips exactly the recorded units and redoes the rest.

The folder is keyed by a plan (the config and the inputs): a rerun with another plan starts over.
"""

from __future__ import annotations

import json
import os
import shutil


def write_atomic(path: str, data: bytes) -> None:
    """`data` at `path`, never a half-written file (written beside it, then renamed)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _blob(plan: dict) -> str:
    return json.dumps(plan, sort_keys=True, default=str)


class Ledger:
    """Finished units by integer key, each with the counts its worker returned."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.done_dir = os.path.join(folder, "done")
        os.makedirs(self.done_dir, exist_ok=True)

    @staticmethod
    def holds(folder: str, plan: dict) -> bool:
        """Whether `folder` is a ledger kept for `plan` (what a rerun may resume)."""
        path = os.path.join(folder, "plan.json")
        if not os.path.exists(path):
            return False
        with open(path) as f:
            return f.read() == _blob(plan)

    @classmethod
    def open(cls, folder: str, plan: dict) -> Ledger:
        """The ledger for `plan` under `folder`; a folder left by another plan is emptied."""
        if not cls.holds(folder, plan):
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            write_atomic(os.path.join(folder, "plan.json"), _blob(plan).encode())
        return cls(folder)

    def _path(self, key: int) -> str:
        return os.path.join(self.done_dir, f"{key:08d}.json")

    def record(self, key: int, counts: dict) -> None:
        write_atomic(self._path(key), json.dumps(counts, sort_keys=True).encode())

    def finished(self) -> dict[int, dict]:
        """Every recorded unit's counts, by key."""
        out = {}
        for name in os.listdir(self.done_dir):
            if name.endswith(".json"):
                with open(os.path.join(self.done_dir, name)) as f:
                    out[int(name[:-5])] = json.load(f)
        return out
