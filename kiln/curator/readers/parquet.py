"""Parquet reader: one row group per task; rows whose text is missing or not a string are
rejected."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow.parquet as pq

from kiln.curator.config import ReadConfig
from kiln.curator.readers import base


def read_parquet(task: base.ReadTask, cfg: ReadConfig) -> Iterator[dict]:
    name = os.path.basename(task.path)
    pf = pq.ParquetFile(task.path)
    cols = [
        c
        for c in (cfg.id_field, cfg.text_field, cfg.source_field, cfg.url_field)
        if c in pf.schema_arrow.names
    ]
    table = pf.read_row_group(task.start, columns=cols)
    n = table.num_rows
    ids = table.column(cfg.id_field).to_pylist() if cfg.id_field in cols else [None] * n
    texts = table.column(cfg.text_field).to_pylist() if cfg.text_field in cols else [None] * n
    sources = table.column(cfg.source_field).to_pylist() if cfg.source_field in cols else [None] * n
    urls = table.column(cfg.url_field).to_pylist() if cfg.url_field in cols else [None] * n
    for i, (id_, text, src, url) in enumerate(zip(ids, texts, sources, urls, strict=True)):
        id_ = str(id_) if id_ is not None else f"{name}:{task.start}:{i}"
        src = src if isinstance(src, str) else name
        if text is None:
            yield base.record(id_, None, src, base.MISSING_TEXT)
        elif isinstance(text, bytes):
            try:
                yield base.record(id_, text.decode("utf-8"), src)
            except UnicodeDecodeError:
                yield base.record(id_, text.decode("utf-8", "replace"), src, base.INVALID_UTF8)
        elif not isinstance(text, str):
            yield base.record(id_, str(text), src, base.NON_STRING_TEXT)
        else:
            yield base.record(id_, text, src, url=url if isinstance(url, str) else None)
