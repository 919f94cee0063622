"""Task decontamination: drop documents that share a long word n-gram with an evaluation set.

As in GPT-3 / NeMo Curator's task decontamination: text is lowercased and cut into tokens —
each CJK/kana/Thai character is a token, other runs of letters and digits are tokens,
punctuation separates — and a document is dropped when it shares an `ngram`-token sequence
(default 13) with any eval item. Eval items shorter than `ngram` but at least `min_ngram` tokens
long match as a whole. N-grams are compared as 64-bit hashes of stable per-token hashes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kiln.curator.filters.base import DocumentFilter
from kiln.curator.filters.batch import NO_SPACE_SCRIPTS, DocBatch
from kiln.platform.errors import InputError

_PRIME = np.uint64(1_099_511_628_211)
_CJK = rf"([{NO_SPACE_SCRIPTS}\x{{30FC}}\x{{FF70}}])"


def tokens(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(stable 64-bit hash of each token, its document) for an Arrow string array."""
    t = pc.utf8_lower(texts)
    t = pc.replace_substring_regex(t, _CJK, r" \1 ")
    t = pc.replace_substring_regex(t, r"[^\pL\pN]+", " ")
    lists = pc.utf8_split_whitespace(t)
    values = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    doc = np.repeat(np.arange(len(texts)), pc.list_value_length(lists).to_numpy())
    keep = values != ""
    values, doc = values[keep], doc[keep]
    return pd.util.hash_array(values.astype(object), categorize=True), doc


def ngram_hashes(tok: np.ndarray, doc: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every n-token window that stays inside one document, the window's document)."""
    m = len(tok) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    h = np.zeros(m, dtype=np.uint64)
    for k in range(n):
        h = h * _PRIME + tok[k : k + m]
    inside = doc[:m] == doc[n - 1 :]
    return h[inside], doc[:m][inside]


def read_eval_texts(path: str) -> list[str]:
    """JSONL: every string field of every object (question, answer, choices); else one a line."""
    if not os.path.isfile(path):
        raise InputError(f"filters.decontaminate: {path}: eval set file not found")
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not path.endswith((".jsonl", ".json")):
                out.append(line.strip())
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"filters.decontaminate: {path}:{i}: not valid JSON") from None
            values = obj.values() if isinstance(obj, dict) else [obj]
            out += _strings(values)
    return out


def _strings(values) -> list[str]:
    out = []
    for v in values:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, list | dict):
            out += _strings(v.values() if isinstance(v, dict) else v)
    return out


class Decontaminate(DocumentFilter):
    name = "decontaminated"

    def __init__(self, eval_texts: list[str], ngram: int = 13, min_ngram: int = 8):
        self.n = ngram
        tok, doc = tokens(pa.array(eval_texts, pa.large_string()))
        lengths = np.bincount(doc, minlength=len(eval_texts))
        long_grams, _ = ngram_hashes(tok, doc, ngram)
        self.grams = {ngram: np.unique(long_grams)}
        for length in np.unique(lengths[(lengths >= min_ngram) & (lengths < ngram)]):
            grams, gdoc = ngram_hashes(tok, doc, int(length))
            self.grams[int(length)] = np.unique(grams[lengths[gdoc] == length])

    @classmethod
    def from_files(cls, paths: list[str], ngram: int = 13, min_ngram: int = 8) -> Decontaminate:
        return cls([t for p in paths for t in read_eval_texts(p)], ngram, min_ngram)

    def contaminated(self, texts: pa.Array) -> np.ndarray:
        tok, doc = tokens(texts)
        hit = np.zeros(len(texts), dtype=bool)
        for n, table in self.grams.items():
            if len(table):
                grams, gdoc = ngram_hashes(tok, doc, n)
                hit[gdoc[np.isin(grams, table, assume_unique=False)]] = True
        return hit

    def keep(self, batch: DocBatch) -> np.ndarray:
        return ~self.contaminated(batch.arr)
