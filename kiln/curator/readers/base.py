"""Read tasks and the record shape every reader yields.

A task is one unit of streamed work (a byte range of a JSONL file, a Parquet row group, a group
of text files, a WARC file). Tasks are numbered in a fixed order, and every record gets the
row key `task << 32 | ordinal`, so output never depends on scheduling.
"""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from kiln.platform.errors import InputError

# Reasons a record is rejected before cleaning.
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
INVALID_UTF8 = "invalid_utf8"
MISSING_TEXT = "missing_text"
NON_STRING_TEXT = "non_string_text"
EMPTY_TEXT = "empty_text"
TOO_LARGE = "too_large"
NO_TEXT_EXTRACTED = "no_text_extracted"


@dataclass
class ReadTask:
    index: int
    kind: str  # jsonl | parquet | text | warc
    path: str
    start: int = 0  # byte offset (jsonl) or row group (parquet)
    end: int = -1
    files: list[str] = field(default_factory=list)  # text folders
    root: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReadTask:
        return cls(**d)


def record(
    id_: str | None,
    text: str | None,
    source: str,
    reason: str | None = None,
    url: str | None = None,
) -> dict:
    return {"id": id_, "text": text, "source": source, "reason": reason, "url": url}


def file_kind(path: str) -> str | None:
    name = path.lower()
    if name.endswith(
        (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
    ):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".warc", ".warc.gz", ".arc.gz")):
        return "warc"
    if name.endswith((".txt", ".text", ".md")):
        return "text"
    return None


def expand_inputs(inputs: list[str]) -> list[str]:
    """Files, folders (recursively) and globs -> a sorted list of readable files."""
    if not inputs:
        raise InputError("curate.input: no input paths given (expected files, folders or globs)")
    files: list[str] = []
    for spec in inputs:
        matches = (
            sorted(glob.glob(spec, recursive=True)) if any(c in spec for c in "*?[") else [spec]
        )
        if not matches or not any(os.path.exists(m) for m in matches):
            raise InputError(f"{spec}: input not found (expected a file, folder or glob)")
        for m in matches:
            if os.path.isdir(m):
                for dirpath, _, names in os.walk(m):
                    files += [os.path.join(dirpath, n) for n in names if file_kind(n)]
            elif file_kind(m):
                files.append(m)
            else:
                raise InputError(
                    f"{m}: unknown input format "
                    "(expected .jsonl[.gz|.zst], .parquet, .txt or .warc[.gz])"
                )
    return sorted(set(files))


def plan_tasks(files: list[str], split_bytes: int, text_files_per_task: int) -> list[ReadTask]:
    """Split inputs into tasks; plain JSONL by byte range, Parquet by row group, text files in
    groups."""
    import pyarrow.parquet as pq

    tasks: list[ReadTask] = []
    text_files = [f for f in files if file_kind(f) == "text"]
    for path in files:
        kind = file_kind(path)
        if kind == "jsonl":
            size = os.path.getsize(path)
            if path.endswith((".gz", ".zst")) or size <= split_bytes:
                tasks.append(ReadTask(len(tasks), kind, path))
            else:
                for start in range(0, size, split_bytes):
                    tasks.append(
                        ReadTask(len(tasks), kind, path, start, min(size, start + split_bytes))
                    )
        elif kind == "parquet":
            for rg in range(pq.ParquetFile(path).num_row_groups):
                tasks.append(ReadTask(len(tasks), kind, path, rg, rg + 1))
        elif kind == "warc":
            tasks.append(ReadTask(len(tasks), kind, path))
    if text_files:
        root = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in text_files])
        for i in range(0, len(text_files), text_files_per_task):
            group = text_files[i : i + text_files_per_task]
            tasks.append(ReadTask(len(tasks), "text", group[0], files=group, root=root))
    return tasks
