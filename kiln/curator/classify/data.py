"""Reading texts for the classifiers: Parquet (a Corpus), JSONL (plain, .gz, .zst) or .txt files
(one document each), given as files, folders or globs."""

from __future__ import annotations

import glob
import json
import os

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.platform.errors import InputError

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".txt", ".md")


def expand(paths: list[str], field: str) -> list[str]:
    files: list[str] = []
    for raw in paths:
        if os.path.isdir(raw):
            found = sorted(
                p
                for p in glob.glob(os.path.join(raw, "**", "*"), recursive=True)
                if p.endswith(SUFFIXES) and "rejected" not in os.path.relpath(p, raw).split(os.sep)
            )
        else:
            found = sorted(glob.glob(raw)) if any(c in raw for c in "*?[") else [raw]
        if not found or not all(os.path.isfile(p) for p in found):
            raise InputError(f"{field}: {raw}: no such file, folder or matching files")
        files += found
    return files


def read_table(path: str, text_field: str = "text") -> pa.Table:
    """A table with at least `text` (and `id`) from one file."""
    if path.endswith(".parquet"):
        table = pq.read_table(path)
    elif path.endswith((".txt", ".md")):
        with open(path, encoding="utf-8", errors="replace") as f:
            table = pa.table({"id": [path], "text": [f.read()]})
    else:
        rows = []
        with fsspec.open(path, "rt", encoding="utf-8", compression="infer") as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        raise InputError(f"{path}:{i}: not valid JSON") from None
        table = pa.Table.from_pylist(rows)
    if text_field not in table.column_names:
        raise InputError(f"{path}: no {text_field!r} column")
    if text_field != "text":
        table = table.rename_columns(["text" if c == text_field else c for c in table.column_names])
    if "id" not in table.column_names:
        ids = [f"{os.path.basename(path)}:{i}" for i in range(table.num_rows)]
        table = table.append_column("id", pa.array(ids, pa.string()))
    return table


def read_texts(paths: list[str], field: str, text_field: str = "text") -> list[str]:
    return [
        t
        for p in expand(paths, field)
        for t in read_table(p, text_field).column("text").to_pylist()
        if t
    ]


def read_labelled(
    paths: str | list[str], text_field: str, label_field: str, threshold: float | None = None
) -> tuple[list[str], list[str]]:
    """(texts, labels) from labelled files, folders or globs. With `threshold`, labels are numbers
    (an annotator's score) turned into `high` (>= threshold) and `low`."""
    texts: list[str] = []
    labels: list = []
    paths = [paths] if isinstance(paths, str) else paths
    for file in expand(paths, "classify.labelled"):
        table = read_table(file, text_field)
        if label_field not in table.column_names:
            raise InputError(f"classify.labelled: {file}: no {label_field!r} field")
        texts += table.column("text").to_pylist()
        labels += table.column(label_field).to_pylist()
    if threshold is None:
        return texts, [str(x) for x in labels]
    try:
        return texts, ["high" if float(x) >= threshold else "low" for x in labels]
    except (TypeError, ValueError):
        raise InputError(
            f"classify.labelled: label_threshold needs numeric {label_field!r} values "
            f"(got {sorted({str(x) for x in labels})[:5]})"
        ) from None
