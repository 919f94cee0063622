"""Per-document work on one batch: validate -> clean -> PII -> filter -> exact hash + MinHash
bands.

`ChunkProcessor` is what a streaming actor (or the inline loop) holds; it turns a list of read
records into a table of candidates for dedup and a table of rejected documents with reasons.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pyarrow as pa

from kiln.curator.clean import Cleaner
from kiln.curator.config import CurateConfig
from kiln.curator.dedup.gpu import CudfMinHasher
from kiln.curator.dedup.minhash import MinHasher
from kiln.curator.filters import DocBatch, DocumentFilter, Language, build_filters
from kiln.curator.filters.japanese import JapaneseSegmenter
from kiln.curator.pii import PiiCounts, PiiScanner

EMPTY_AFTER_CLEANING = "empty_after_cleaning"
PII = "pii"
REJECTED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("text", pa.large_string()),
        ("source", pa.string()),
        ("language", pa.string()),
        ("reason", pa.string()),
    ]
)


def band_columns(bands: int) -> list[str]:
    return [f"_b{b:02d}" for b in range(bands)]


def text_hash(texts: list[str]) -> np.ndarray:
    """64-bit BLAKE2b of each (already normalised) text, as int64."""
    raw = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in texts)
    return np.frombuffer(raw, dtype="<i8").copy()


class ChunkProcessor:
    def __init__(self, cfg: CurateConfig, extra_filters: list[DocumentFilter] = ()):
        self.cfg = cfg
        self.cleaner = Cleaner(cfg.clean)
        self.filters = build_filters(cfg.filters, list(extra_filters))
        words = cfg.filters.japanese_words
        self.segmenter = JapaneseSegmenter() if words == "tokenizer" else None
        self.pii = PiiScanner(cfg.pii) if cfg.pii.enabled else None
        self.pii_counts = PiiCounts()  # summed over every batch; the stream reads and resets it
        self.language = next((f for f in self.filters if isinstance(f, Language)), None)
        fz = cfg.dedup.fuzzy
        hasher = CudfMinHasher if cfg.backend == "cudf" else MinHasher
        self.minhasher = (
            hasher(fz.ngram, fz.bands, fz.rows, fz.seed, fz.signature) if fz.enabled else None
        )

    def take_pii_counts(self) -> PiiCounts:
        counts, self.pii_counts = self.pii_counts, PiiCounts()
        return counts

    def _scan_pii(self, idx: np.ndarray, texts: list, reasons: list) -> np.ndarray:
        """Redact (or count) PII in the documents at `idx`; in drop mode, reject those holding
        any. Returns the indices still in the running."""
        scanned, hit, counts = self.pii.scan([texts[i] for i in idx])
        self.pii_counts.add(counts)
        for i, t in zip(idx, scanned, strict=True):
            texts[i] = t
        if self.cfg.pii.mode != "drop":
            return idx
        for i in idx[hit]:
            reasons[i] = PII
        return idx[~hit]

    def process(
        self, records: list[dict], row_keys: np.ndarray
    ) -> tuple[pa.Table, pa.Table, Counter]:
        """(kept candidates with `_row`, `_hash` (exact dedup on), band columns (fuzzy dedup on);
        rejected with `reason`; reason counts)."""
        reasons: list[str | None] = [r["reason"] for r in records]
        texts: list[str | None] = [r["text"] for r in records]
        ok = np.array([r is None for r in reasons], dtype=bool)
        idx = np.nonzero(ok)[0]
        cleaned = self.cleaner([texts[i] for i in idx]) if len(idx) else []
        for i, t in zip(idx, cleaned, strict=True):
            texts[i] = t
            if not t:
                reasons[i] = EMPTY_AFTER_CLEANING
        idx = np.array([i for i in idx if reasons[i] is None], dtype=np.int64)
        if self.pii is not None and len(idx):
            idx = self._scan_pii(idx, texts, reasons)
        language = [None] * len(records)
        if len(idx):
            batch = DocBatch(
                [texts[i] for i in idx],
                self.cfg.filters.no_space_script_ratio,
                urls=[records[i].get("url") for i in idx],
                segmenter=self.segmenter,
            )
            failed = np.zeros(len(idx), dtype=bool)
            for f in self.filters:
                bad = ~np.asarray(f.keep(batch), dtype=bool) & ~failed
                for j in np.nonzero(bad)[0]:
                    reasons[idx[j]] = f.name
                failed |= bad
            if self.language is not None:
                for i, lang in zip(idx, self.language.detect(batch), strict=True):
                    language[i] = str(lang)
        keep = np.array([r is None for r in reasons], dtype=bool)
        counts = Counter(r for r in reasons if r is not None)
        kept_idx = np.nonzero(keep)[0]
        kept_texts = [texts[i] for i in kept_idx]
        columns = {
            "_row": pa.array(row_keys[kept_idx], pa.int64()),
            "id": pa.array([records[i]["id"] for i in kept_idx], pa.string()),
            "text": pa.array(kept_texts, pa.large_string()),
            "source": pa.array([records[i]["source"] for i in kept_idx], pa.string()),
            "language": pa.array([language[i] for i in kept_idx], pa.string()),
        }
        if self.cfg.dedup.exact:  # exact dedup's key: no other step reads it
            columns["_hash"] = pa.array(text_hash(kept_texts), pa.int64())
        if self.minhasher is not None:
            bands = self.minhasher.band_hashes(self.minhasher.signatures(kept_texts)).view(np.int64)
            for b, name in enumerate(band_columns(self.minhasher.bands)):
                columns[name] = pa.array(bands[:, b], pa.int64())
        kept = pa.table(columns)
        rej_idx = np.nonzero(~keep)[0]
        rejected = pa.table(
            {
                "id": pa.array([records[i]["id"] for i in rej_idx], pa.string()),
                "text": pa.array([texts[i] for i in rej_idx], pa.large_string()),
                "source": pa.array([records[i]["source"] for i in rej_idx], pa.string()),
                "language": pa.array([language[i] for i in rej_idx], pa.string()),
                "reason": pa.array([reasons[i] for i in rej_idx], pa.string()),
            },
            schema=REJECTED_SCHEMA,
        )
        return kept, rejected, counts
