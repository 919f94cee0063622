"""Find, count and act on PII in a batch of documents.

Arrow's RE2 tests every recogniser's gate over the whole batch at once; only the documents a
gate hits go through Python's `re` with the recogniser's check (Luhn, mod 97, ...), so a corpus
with little PII costs one vectorised pass per type."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kiln.curator.config import PiiConfig
from kiln.curator.pii.recognizers import RECOGNIZERS, Recognizer


@dataclass
class PiiCounts:
    """Items found per type, documents holding each type, and documents holding any."""

    items: Counter = field(default_factory=Counter)
    documents: Counter = field(default_factory=Counter)
    any: int = 0

    def add(self, other: PiiCounts) -> None:
        self.items += other.items
        self.documents += other.documents
        self.any += other.any

    def to_dict(self) -> dict:
        return {"items": dict(self.items), "documents": dict(self.documents), "any": self.any}

    @classmethod
    def from_dict(cls, d: dict) -> PiiCounts:
        return cls(Counter(d.get("items", {})), Counter(d.get("documents", {})), d.get("any", 0))


class PiiScanner:
    """`scan(texts)` -> (texts, which documents hold PII, counts). In `redact` mode the texts
    come back with every item replaced by its type's tag; otherwise unchanged."""

    def __init__(self, cfg: PiiConfig):
        self.cfg = cfg
        self.recognizers = [r for r in RECOGNIZERS if r.kind in cfg.kinds]
        self.compiled = [re.compile(r.pattern, re.ASCII) for r in self.recognizers]

    def tag(self, r: Recognizer) -> str:
        return self.cfg.tags.get(r.kind, r.tag)

    def scan(self, texts: list[str]) -> tuple[list[str], np.ndarray, PiiCounts]:
        arr = pa.array(texts, pa.large_string())
        work = list(texts)  # redacted in every mode: a span counts under one type only
        found: dict[int, set[str]] = {}
        counts = PiiCounts()
        for r, rx in zip(self.recognizers, self.compiled, strict=True):
            gate = pc.match_substring_regex(arr, r.gate or r.pattern)
            for i in np.nonzero(gate.to_numpy(zero_copy_only=False))[0]:
                work[i], n = self._replace(work[i], r, rx)
                if n:
                    counts.items[r.kind] += n
                    found.setdefault(int(i), set()).add(r.kind)
        for kinds in found.values():
            counts.documents.update(kinds)
        counts.any = len(found)
        hit = np.zeros(len(texts), dtype=bool)
        hit[list(found)] = True
        return (work if self.cfg.mode == "redact" else list(texts)), hit, counts

    def _replace(self, text: str, r: Recognizer, rx: re.Pattern) -> tuple[str, int]:
        """The text with the recogniser's valid items replaced by its tag, and how many."""
        tag = self.tag(r)
        if r.check is None:
            return rx.subn(tag, text)
        n = 0

        def sub(m: re.Match) -> str:
            nonlocal n
            if r.check(m.group(0)):
                n += 1
                return tag
            return m.group(0)

        return rx.sub(sub, text), n
