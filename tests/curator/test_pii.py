"""PII: every planted item of every type is found and replaced by its tag (recall 1.0), the
near-misses (Luhn and mod-97 failures, dates, versions, clock times) are left alone, and the
curator's drop/flag modes and report conserve the counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.clean import Cleaner
from kiln.curator.config import PROSE_RULES, CleanConfig, PiiConfig
from kiln.curator.pii import DEFAULT_TAGS, PiiScanner
from kiln.curator.process import ChunkProcessor
from kiln.platform.report_curation import curation_section


def _my_number(body: str) -> str:
    """A valid Individual Number: the check digit computed from the published rule."""
    q = [n + 1 if n <= 6 else n - 5 for n in range(1, 12)]
    r = sum(int(p) * w for p, w in zip(reversed(body), q, strict=True)) % 11
    return body + str(0 if r <= 1 else 11 - r)


PLANTED = {
    "email": ["jane.doe@example.org", "taro_yamada@mail.example.co.jp", "ops+alerts@kiln.dev"],
    "phone": [
        "+1 415-555-0199",
        "+81 3-1234-5678",
        "+81-90-1234-5678",
        "+44 20 7946 0958",
        "03-1234-5678",
        "090-1234-5678",
        "080-9876-5432",
        "070-1111-2222",
        "(03) 1234-5678",
        "09012345678",
        "0120-123-456",
        "(415) 555-0199",
    ],
    "ip": ["192.168.10.4", "8.8.8.8", "2001:db8::8a2e:370:7334", "fe80::1", "::1"],
    "credit_card": [
        "4111 1111 1111 1111",
        "5555-5555-5555-4444",
        "378282246310005",
        "3530111333300000",
        "2223003122003222",
        "6011111111111117",
        "30569309025904",
    ],
    "iban": [
        "GB82 WEST 1234 5698 7654 32",
        "DE89370400440532013000",
        "FR1420041010050500013M02606",
    ],
    "my_number": [_my_number("12345678901"), _my_number("98765432109"), "1234 5678 9018"],
    "postcode": ["〒100-0001", "〒 530-0001", "94105-1234"],
    "secret": [
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "xoxb-123456789012-abcdefghijkl",
        "sk-proj-" + "Zx9_Yw8-Vu7t" * 4,
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7x\nq1w2e3r4==\n"
        "-----END RSA PRIVATE KEY-----",
    ],
}

NEAR_MISSES = [
    "card 4111 1111 1111 1112 fails Luhn",
    "5555-5555-5555-4445 fails Luhn too",
    "5950000000001 passes Luhn on no card network's prefix, 000000000000 is no My Number",
    "IBAN GB82 WEST 1234 5698 7654 33 fails mod 97",
    "my number 123456789010 has a wrong check digit",
    "released on 2024-01-15, 2024/03/15 and 03-15-2024",
    "build v1.2.3.4 and version 1.2.3.4.5 of the tool",
    "at 12:30:45 call std::vector or the MAC 00:1a:2b:3c:4d:5e",
    "order 1234567, ZIP 90210, room 101-2024",
    "an ordinary sentence about @mentions and user@localhost",
    "日付は2024年1月15日、版は3.2.1です。",
]

SENTENCES = ["Contact {} for details.", "連絡先：{} まで。", "see ({}), then continue"]


def _planted_docs() -> list[tuple[str, str, str]]:
    return [
        (kind, value, SENTENCES[i % len(SENTENCES)].format(value))
        for kind, values in PLANTED.items()
        for i, value in enumerate(values)
    ]


def test_every_planted_item_is_redacted_with_its_tag():
    docs = _planted_docs()
    out, hit, counts = PiiScanner(PiiConfig(enabled=True)).scan([d for _, _, d in docs])
    for (kind, value, doc), got in zip(docs, out, strict=True):
        assert got == doc.replace(value, DEFAULT_TAGS[kind]), (kind, value, got)
    assert hit.all()
    assert dict(counts.items) == {k: len(v) for k, v in PLANTED.items()}
    assert dict(counts.documents) == {k: len(v) for k, v in PLANTED.items()}
    assert counts.any == len(docs)


def test_near_misses_are_left_alone():
    out, hit, counts = PiiScanner(PiiConfig(enabled=True)).scan(NEAR_MISSES)
    assert out == NEAR_MISSES
    assert not hit.any() and counts.any == 0 and not counts.items


def test_kinds_and_tags_are_configurable():
    text = "mail a@b.example or 03-1234-5678"
    cfg = PiiConfig(enabled=True, kinds=["email"], tags={"email": "[redacted]"})
    (out,), _, counts = PiiScanner(cfg).scan([text])
    assert out == "mail [redacted] or 03-1234-5678"
    assert dict(counts.items) == {"email": 1}


def _processor(mode: str) -> ChunkProcessor:
    filters = {**PROSE_RULES, "top_ngram_char_fraction": None}
    cfg = CurateConfig(pii={"enabled": True, "mode": mode}, filters=filters)
    return ChunkProcessor(cfg)


@pytest.mark.parametrize("mode", ["drop", "flag", "redact"])
def test_modes_conserve_documents(mode):
    texts = [d for _, _, d in _planted_docs()] + NEAR_MISSES
    recs = [{"id": str(i), "text": t, "source": "t", "reason": None} for i, t in enumerate(texts)]
    proc = _processor(mode)
    kept, rejected, reasons = proc.process(recs, np.arange(len(recs), dtype=np.int64))
    counts = proc.take_pii_counts()
    n_pii = len(texts) - len(NEAR_MISSES)
    assert kept.num_rows + rejected.num_rows == len(texts)
    assert counts.any == n_pii and sum(counts.items.values()) == n_pii
    kept_text = kept.column("text").to_pylist()
    if mode == "drop":
        assert dict(reasons) == {"pii": n_pii}
        assert sorted(kept_text) == sorted(NEAR_MISSES)
    elif mode == "flag":
        cleaned = Cleaner(CleanConfig())(texts)  # unchanged by the PII step
        assert rejected.num_rows == 0 and sorted(kept_text) == sorted(cleaned)
    else:
        assert rejected.num_rows == 0 and sum("<" in t for t in kept_text) == n_pii
    assert proc.take_pii_counts().any == 0  # taken once


def test_html_report_shows_counts_per_type():
    report = {
        "documents_in": 3,
        "kept": 3,
        "steps": [{"step": "pii", "in": 3, "removed": 0, "kept": 3}],
        "pii": {"mode": "flag", "items": {"email": 2}, "documents": {"email": 1}, "any": 1},
    }
    html = curation_section(
        report, Path("/nonexistent"), False, lambda rows, head=None: repr((head, rows))
    )
    assert repr((["PII type (flag)", "items", "documents"], [["email", 2, 1]])) in html


def test_report_counts_pii_per_type(tmp_path):
    docs = _planted_docs()
    with open(tmp_path / "in.jsonl", "w") as f:
        for i, (_, _, text) in enumerate(docs + [("", "", t) for t in NEAR_MISSES]):
            f.write(json.dumps({"id": f"d{i}", "text": text}, ensure_ascii=False) + "\n")
    filters = {**PROSE_RULES, "top_ngram_char_fraction": None}
    cfg = CurateConfig(
        input=[str(tmp_path / "in.jsonl")],
        pii={"enabled": True, "mode": "drop"},
        filters=filters,
        dedup={"exact": False, "fuzzy": {"enabled": False}},
        output={"plot": False},
        stream="inline",
    )
    report = curate(cfg, str(tmp_path / "out"))
    step = next(s for s in report["steps"] if s["step"] == "pii")
    assert step["removed"] == len(docs) and step["mode"] == "drop"
    assert step["items"] == {k: len(v) for k, v in PLANTED.items()}
    assert report["kept"] == len(NEAR_MISSES) and report["invariant_holds"]
    assert report["removed_by_reason"] == {"pii": len(docs)}
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["pii"]["items"] == step["items"]
