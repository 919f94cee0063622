"""Readers: JSONL plain/.gz/.zst (also split by byte range), Parquet, text folders, WARC."""

from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from kiln.curator.config import ReadConfig
from kiln.curator.readers import expand_inputs, plan_tasks, read_task
from kiln.platform.errors import InputError

LINES = [
    b'{"id": "a", "text": "first doc", "source": "s1"}\n',
    b"\n",
    b"not json\n",
    b'{"text": "no id here"}\n',
    b'{"id": 7, "text": ["list"]}\n',
    b'{"id": "u", "text": "bad \xff utf8"}\n',
    b'{"id": "big", "text": "' + b"x" * 200 + b'"}\n',
    b'{"id": "e", "text": ""}\n',
]
EXPECTED = [
    ("a", None),
    (f"in.jsonl:{len(b''.join(LINES[:2])):012d}", "invalid_json"),
    (f"in.jsonl:{len(b''.join(LINES[:3])):012d}", None),
    ("7", "non_string_text"),
    ("u", "invalid_utf8"),
    ("big", "too_large"),
    ("e", "empty_text"),
]


def _read_all(paths, cfg=None, split=1 << 30):
    cfg = cfg or ReadConfig(max_doc_chars=100)
    tasks = plan_tasks(expand_inputs([str(p) for p in paths]), split, 2)
    return [r for t in tasks for r in read_task(t, cfg)]


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_jsonl_compressions_and_malformed_lines(tmp_path, suffix):
    data = b"".join(LINES)
    path = tmp_path / f"in.jsonl{suffix}"
    if suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif suffix == ".zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        path.write_bytes(data)
    recs = _read_all([path])
    got = [(r["id"].replace(f"in.jsonl{suffix}", "in.jsonl"), r["reason"]) for r in recs]
    assert got == EXPECTED
    assert recs[0]["source"] == "s1" and recs[2]["source"] == f"in.jsonl{suffix}"


def test_byte_range_splits_read_every_line_once(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(
        b"".join(
            json.dumps({"id": str(i), "text": "t" * (i % 37 + 1)}).encode() + b"\n"
            for i in range(500)
        )
    )
    whole = _read_all([path])
    split = _read_all([path], split=997)
    assert len(plan_tasks([str(path)], 997, 1)) > 10
    assert [r["id"] for r in split] == [r["id"] for r in whole] == [str(i) for i in range(500)]


def test_parquet_and_text_folders(tmp_path):
    pq.write_table(
        pa.table({"id": ["p1", "p2"], "text": ["parquet text", None]}), tmp_path / "d.parquet"
    )
    folder = tmp_path / "docs" / "sub"
    folder.mkdir(parents=True)
    (folder / "one.txt").write_text("plain text file")
    (folder / "two.txt").write_bytes(b"\xff\xfe")
    recs = _read_all([tmp_path / "d.parquet", tmp_path / "docs"])
    assert [(r["id"], r["reason"]) for r in recs] == [
        ("p1", None),
        ("p2", "missing_text"),
        ("one.txt", None),
        ("two.txt", "invalid_utf8"),
    ]


def test_warc_html_extraction(tmp_path):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    body = (
        "<html><head><title>T</title></head><body><nav>Home | About</nav><article><h1>Rivers</h1>"
        + "".join(
            f"<p>The river number {i} flows quietly through the green valley toward the sea.</p>"
            for i in range(8)
        )
        + "</article><footer>Copyright</footer></body></html>"
    ).encode()
    path = tmp_path / "crawl.warc.gz"
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True)
        for url, payload in [
            ("http://example.com/a", body),
            ("http://example.com/empty", b"<html></html>"),
        ]:
            headers = StatusAndHeaders(
                "200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.0"
            )
            writer.write_record(
                writer.create_warc_record(
                    url, "response", payload=io.BytesIO(payload), http_headers=headers
                )
            )
    recs = _read_all([path], ReadConfig())
    assert len(recs) == 2
    assert (
        recs[0]["reason"] is None
        and "flows quietly" in recs[0]["text"]
        and "Home | About" not in recs[0]["text"]
    )
    assert recs[0]["id"].startswith("<urn:uuid:") and recs[0]["source"] == "crawl.warc.gz"
    assert recs[1]["reason"] == "no_text_extracted"


def test_missing_and_unknown_inputs(tmp_path):
    with pytest.raises(InputError, match="not found"):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(InputError, match="unknown input format"):
        expand_inputs([str(tmp_path / "x.csv")])
