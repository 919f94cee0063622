"""Readers: JSONL (plain/.gz/.zst), Parquet, plain-text folders and WARC, each yielding records
`{id, text, source, reason}` where `reason` is set for malformed input."""

from __future__ import annotations

from collections.abc import Iterator

from kiln.curator.config import ReadConfig
from kiln.curator.readers import base
from kiln.curator.readers.base import ReadTask, expand_inputs, plan_tasks
from kiln.curator.readers.jsonl import read_jsonl
from kiln.curator.readers.parquet import read_parquet
from kiln.curator.readers.text import read_text_files
from kiln.curator.readers.warc import read_warc


def read_task(task: ReadTask, cfg: ReadConfig) -> Iterator[dict]:
    """All records of one task, with size and emptiness checks applied."""

    reader = {
        "jsonl": read_jsonl,
        "parquet": read_parquet,
        "text": read_text_files,
        "warc": read_warc,
    }[task.kind]
    for rec in reader(task, cfg):
        if rec["reason"] is None:
            text = rec["text"]
            if not text.strip():
                rec["reason"] = base.EMPTY_TEXT
            elif len(text) > cfg.max_doc_chars:
                rec["reason"] = base.TOO_LARGE
        yield rec


__all__ = ["ReadTask", "expand_inputs", "plan_tasks", "read_task"]
