"""JSONL reader (plain, .gz, .zst) that turns every malformed line into a rejected record."""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator

from kiln.curator.config import ReadConfig
from kiln.curator.readers import base


def _open(path: str) -> io.BufferedIOBase:
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True)
    return open(path, "rb")


def _lines(task: base.ReadTask) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) pairs of the task's range; a range owns the lines that start in it."""
    if task.end < 0:
        with _open(task.path) as f:
            stream = io.BufferedReader(f, 1 << 20) if task.path.endswith(".zst") else f
            offset = 0  # offsets of the decompressed stream: stable ids for compressed files too
            for line in stream:
                yield offset, line
                offset += len(line)
        return
    with open(task.path, "rb") as f:
        start = task.start
        if start > 0:
            f.seek(start - 1)
            start += len(f.readline()) - 1  # skip the line that began in the previous range
        offset = start
        f.seek(offset)
        while offset < task.end:
            line = f.readline()
            if not line:
                break
            yield offset, line
            offset += len(line)


def parse_line(line: bytes, default_id: str, source: str, cfg: ReadConfig) -> dict | None:
    """One JSONL line -> a record (reason set when malformed); None for blank lines."""
    if not line.strip():
        return None
    try:
        raw = line.decode("utf-8")
    except UnicodeDecodeError:
        fixed = line.decode("utf-8", "replace")
        try:  # keep the record's own id and text (with U+FFFD) when the JSON itself is fine
            obj = json.loads(fixed)
            id_ = str(obj.get(cfg.id_field, default_id)) if isinstance(obj, dict) else default_id
            text = obj.get(cfg.text_field) if isinstance(obj, dict) else None
        except ValueError:
            id_, text = default_id, None
        text = text if isinstance(text, str) else fixed.rstrip("\n")
        return base.record(id_, text, source, base.INVALID_UTF8)
    try:
        obj = json.loads(raw)
    except ValueError:
        return base.record(default_id, raw.rstrip("\n"), source, base.INVALID_JSON)
    if not isinstance(obj, dict):
        return base.record(default_id, raw.rstrip("\n"), source, base.NOT_AN_OBJECT)
    id_ = obj.get(cfg.id_field)
    id_ = default_id if id_ is None or isinstance(id_, (dict, list)) else str(id_)
    src = obj.get(cfg.source_field)
    src = src if isinstance(src, str) else source
    text = obj.get(cfg.text_field)
    if text is None:
        return base.record(id_, None, src, base.MISSING_TEXT)
    if not isinstance(text, str):
        return base.record(id_, json.dumps(text)[:10_000], src, base.NON_STRING_TEXT)
    url = obj.get(cfg.url_field)
    return base.record(id_, text, src, url=url if isinstance(url, str) else None)


def read_jsonl(task: base.ReadTask, cfg: ReadConfig) -> Iterator[dict]:
    name = os.path.basename(task.path)
    for offset, line in _lines(task):
        rec = parse_line(line, f"{name}:{offset:012d}", name, cfg)
        if rec is not None:
            yield rec
