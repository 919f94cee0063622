"""The rows a generate run reads: JSONL (plain, .gz, .zst) or Parquet files (a Corpus's shards),
in file order, each with an `id` (made from the file name and line when absent)."""

from __future__ import annotations

import json
import os

import fsspec
import pyarrow.parquet as pq

from kiln.curator.classify.data import expand
from kiln.platform.errors import InputError

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json")


def input_files(paths: list[str]) -> list[str]:
    files = [p for p in expand(paths, "generate.input") if p.endswith(SUFFIXES)]
    if not files:
        raise InputError(f"generate.input: no JSONL or Parquet files in {', '.join(paths)}")
    return files


def _read_file(path: str) -> list[dict]:
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    rows = []
    with fsspec.open(path, "rt", encoding="utf-8", compression="infer") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"{path}:{i}: not valid JSON") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{i}: expected a JSON object per line")
            rows.append(row)
    return rows


def read_rows(files: list[str]) -> list[dict]:
    """Every row of `files`, in order; a missing `id` is `<file name>:<row number>`."""
    rows = []
    for path in files:
        name = os.path.basename(path)
        for i, row in enumerate(_read_file(path)):
            row["id"] = str(row["id"]) if row.get("id") is not None else f"{name}:{i}"
            rows.append(row)
    return rows


def files_signature(files: list[str]) -> list[list]:
    """Names, sizes and mtimes: a changed input is another plan (and another fingerprint)."""
    out = []
    for path in files:
        st = os.stat(path)
        out.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    return out
