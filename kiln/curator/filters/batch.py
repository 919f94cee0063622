"""`DocBatch`: the texts of one batch plus per-document statistics that filters share.

Statistics are computed lazily, once per batch, over flat Arrow/numpy arrays. Scripts written
without spaces (CJK, kana, Thai) are tokenised into characters, so word-based rules get
character-based equivalents.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NO_SPACE_SCRIPTS = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}"
_ISALPHA: np.ndarray | None = None


def _isalpha_table() -> np.ndarray:
    global _ISALPHA
    if _ISALPHA is None:
        _ISALPHA = np.array([chr(i).isalpha() for i in range(0x30000)], dtype=bool)
    return _ISALPHA


def _np(arr) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


class Segments:
    """A flat array of pieces (words, lines, paragraphs) in document order.

    `doc[i]` is the document of piece i, `ids` a batch-wide integer id per distinct piece,
    `chars` its length, `lengths[d]` the number of pieces of document d."""

    def __init__(
        self, doc: np.ndarray, ids: np.ndarray, chars: np.ndarray, n_docs: int, alpha=None
    ):
        self.doc, self.ids, self.chars = doc, ids, chars
        self.lengths = np.bincount(doc, minlength=n_docs)
        self.alpha = alpha

    @classmethod
    def from_lists(cls, lists: pa.Array, n_docs: int, rows: np.ndarray | None = None) -> Segments:
        """From an Arrow list<string> array (one list per document), dropping blank pieces."""
        values = pc.utf8_trim_whitespace(pc.list_flatten(lists))
        doc = np.repeat(
            np.arange(len(lists)) if rows is None else rows, _np(pc.list_value_length(lists))
        )
        keep = _np(pc.not_equal(values, ""))
        values, doc = values.filter(pa.array(keep)), doc[keep]
        ids = _np(pc.dictionary_encode(values).indices).astype(np.int64)
        seg = cls(doc, ids, _np(pc.utf8_length(values)).astype(np.int64), n_docs)
        seg.values = values
        return seg

    def per_doc(self, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(self.doc, weights=weights, minlength=len(self.lengths))


def _merge(parts: list[Segments], n_docs: int) -> Segments:
    """Interleave per-group segments back into document order (a scatter, no sort)."""
    doc = np.concatenate([p.doc for p in parts])
    lengths = np.bincount(doc, minlength=n_docs)
    offset = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    target = np.empty(len(doc), dtype=np.int64)
    pos = 0
    for p in parts:  # within a group pieces are in document order
        first = np.concatenate([[0], np.cumsum(p.lengths)[:-1]])
        local = np.arange(len(p.doc)) - first[p.doc]
        target[pos : pos + len(p.doc)] = offset[p.doc] + local
        pos += len(p.doc)
    out = [np.empty_like(a) for a in (doc, doc, doc, doc)]
    for o, name in zip(out, ("doc", "ids", "chars", "alpha"), strict=True):
        o[target] = np.concatenate([getattr(p, name) for p in parts])
    return Segments(out[0], out[1], out[2], n_docs, out[3].astype(bool))


class DocBatch:
    def __init__(self, texts: list[str], no_space_ratio: float = 0.3):
        self.texts = texts
        self.arr = pa.array(texts, pa.large_string())
        self.no_space_ratio = no_space_ratio

    def __len__(self) -> int:
        return len(self.texts)

    @cached_property
    def n_chars(self) -> np.ndarray:
        return _np(pc.utf8_length(self.arr)).astype(np.int64)

    def count(self, pattern: str) -> np.ndarray:
        """Regex (RE2) matches per document."""
        return _np(pc.count_substring_regex(self.arr, pattern)).astype(np.int64)

    def count_chars(self, char_class: str) -> np.ndarray:
        """Characters per document in a class given as the inside of [...] (deletes runs of the
        others, which is far cheaper than one regex match per character)."""
        kept = pc.replace_substring_regex(self.arr, f"[^{char_class}]+", "")
        return _np(pc.utf8_length(kept)).astype(np.int64)

    @cached_property
    def lower(self) -> pa.Array:
        return pc.utf8_lower(self.arr)

    @cached_property
    def no_space(self) -> np.ndarray:
        """Documents in scripts written without spaces (CJK, kana, Thai)."""
        letters = self.count_chars(r"\pL")
        return self.count_chars(NO_SPACE_SCRIPTS) >= self.no_space_ratio * np.maximum(letters, 1)

    @cached_property
    def words(self) -> Segments:
        """Whitespace tokens; for unspaced scripts every non-space character is a token."""
        n = len(self)
        parts = []
        spaced = np.nonzero(~self.no_space)[0]
        if len(spaced):
            seg = Segments.from_lists(
                pc.utf8_split_whitespace(self.arr.take(pa.array(spaced))), n, spaced
            )
            seg.alpha = _np(pc.match_substring_regex(seg.values, r"\pL")).astype(np.int64)
            parts.append(seg)
        unspaced = np.nonzero(self.no_space)[0]
        if len(unspaced):
            squeezed = pc.replace_substring_regex(self.arr.take(pa.array(unspaced)), r"\s+", "")
            cps = np.frombuffer("".join(squeezed.to_pylist()).encode("utf-32-le"), dtype=np.uint32)
            doc = np.repeat(unspaced, _np(pc.utf8_length(squeezed)))
            ids = cps.astype(np.int64) + (1 << 40)  # disjoint from dictionary ids
            table = _isalpha_table()
            alpha = np.where(cps < len(table), table[np.minimum(cps, len(table) - 1)], True).astype(
                np.int64
            )
            parts.append(Segments(doc, ids, np.ones(len(cps), dtype=np.int64), n, alpha))
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return Segments(z, z, z, n, z)
        for p in parts:
            p.alpha = np.asarray(p.alpha, dtype=np.int64)
        return parts[0] if len(parts) == 1 else _merge(parts, n)

    @cached_property
    def lines(self) -> Segments:
        return Segments.from_lists(pc.split_pattern(self.arr, "\n"), len(self))

    @cached_property
    def paragraphs(self) -> Segments:
        return Segments.from_lists(pc.split_pattern(self.arr, "\n\n"), len(self))

    @cached_property
    def n_words(self) -> np.ndarray:
        return self.words.lengths

    @cached_property
    def n_lines(self) -> np.ndarray:
        return self.lines.lengths

    def ratio(self, num: np.ndarray, den: np.ndarray) -> np.ndarray:
        return num / np.maximum(den, 1)

    def line_ratio(self, pattern: str) -> np.ndarray:
        """Fraction of a document's non-empty lines that match a regex."""
        hit = _np(pc.match_substring_regex(self.lines.values, pattern))
        return self.ratio(self.lines.per_doc(hit.astype(np.float64)), self.n_lines)
