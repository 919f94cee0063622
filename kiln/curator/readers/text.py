"""Folders of plain-text files: one document per file, id = path relative to the common root."""

from __future__ import annotations

import os
from collections.abc import Iterator

from kiln.curator.config import ReadConfig
from kiln.curator.readers import base


def read_text_files(task: base.ReadTask, cfg: ReadConfig) -> Iterator[dict]:
    source = os.path.basename(task.root) or "text"
    for path in task.files:
        id_ = os.path.relpath(path, task.root)
        with open(path, "rb") as f:
            data = f.read()
        try:
            yield base.record(id_, data.decode("utf-8"), source)
        except UnicodeDecodeError:
            yield base.record(id_, data.decode("utf-8", "replace"), source, base.INVALID_UTF8)
