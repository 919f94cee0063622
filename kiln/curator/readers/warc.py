"""WARC (Common Crawl) reader: HTML responses -> main text with trafilatura, records with warcio."""

from __future__ import annotations

import os
from collections.abc import Iterator

from kiln.curator.config import ReadConfig
from kiln.curator.readers import base


def html_to_text(html: str) -> str | None:
    import trafilatura

    return trafilatura.extract(
        html, include_comments=False, include_tables=True, favor_precision=True
    )


def read_warc(task: base.ReadTask, cfg: ReadConfig) -> Iterator[dict]:
    from warcio.archiveiterator import ArchiveIterator

    name = os.path.basename(task.path)
    with open(task.path, "rb") as f:
        for rec in ArchiveIterator(f):
            if rec.rec_type != "response":
                continue
            ctype = (rec.http_headers.get_header("Content-Type") or "") if rec.http_headers else ""
            if "html" not in ctype.lower():
                continue
            id_ = (
                rec.rec_headers.get_header("WARC-Record-ID")
                or f"{name}:{rec.rec_headers.get_header('WARC-Target-URI')}"
            )
            payload = rec.content_stream().read()
            charset = "utf-8"
            if "charset=" in ctype.lower():
                charset = ctype.lower().split("charset=")[-1].split(";")[0].strip() or "utf-8"
            try:
                html = payload.decode(charset)
            except (UnicodeDecodeError, LookupError):
                html = payload.decode("utf-8", "replace")
            text = html_to_text(html)
            if not text:
                yield base.record(id_, None, name, base.NO_TEXT_EXTRACTED)
            else:
                yield base.record(
                    id_, text, name, url=rec.rec_headers.get_header("WARC-Target-URI")
                )
