"""Gopher repetition statistics, vectorised over a whole batch (Rae et al. 2021, appendix A).

- duplicate lines / paragraphs: the share of pieces (and of their characters) that repeat an
  earlier piece of the same document;
- top n-gram fraction (n = 2..4): characters covered by the most frequent n-gram;
- duplicate n-gram fraction (n = 5..10): characters of words covered by any n-gram occurring twice.

N-grams are 64-bit polynomial hashes of word ids grown one word at a time; counting uses hash
tables (pandas.factorize), not sorting.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kiln.curator.filters.batch import Segments

_PRIME = np.uint64(1_099_511_628_211)
_DOC_MIX = np.uint64(0x9E3779B97F4A7C15)


def _occurrences(keys: np.ndarray) -> np.ndarray:
    """How often each key occurs in the array, per element."""
    codes, _ = pd.factorize(keys)
    return np.bincount(codes)[codes]


def _segment_max(values: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-document maximum of values whose `doc` is sorted."""
    out = np.zeros(n_docs, dtype=values.dtype)
    if len(values):
        first = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
        out[doc[first]] = np.maximum.reduceat(values, first)
    return out


def duplicate_fractions(seg: Segments) -> tuple[np.ndarray, np.ndarray]:
    """(share of pieces, share of characters) that repeat an earlier piece of the same document."""
    n_docs = len(seg.lengths)
    if len(seg.doc) == 0:
        return np.zeros(n_docs), np.zeros(n_docs)
    key = seg.doc * (int(seg.ids.max()) + 1) + seg.ids
    codes, _ = pd.factorize(key)
    first = np.zeros(len(codes), dtype=bool)
    first[np.unique(codes, return_index=True)[1]] = True
    dup = ~first
    total_chars = seg.per_doc(seg.chars.astype(np.float64))
    count_frac = seg.per_doc(dup.astype(np.float64)) / np.maximum(seg.lengths, 1)
    char_frac = seg.per_doc((seg.chars * dup).astype(np.float64)) / np.maximum(total_chars, 1)
    return count_frac, char_frac


class _Tokens:
    """The selected documents' word ids, documents and characters, with prefix sums of chars."""

    def __init__(self, words: Segments, docs: np.ndarray):
        self.n_docs = len(words.lengths)
        self.ids, self.doc, self.chars = words.ids, words.doc, words.chars
        if not docs.all():  # (a batch of one script selects every document: no copies)
            take = docs[words.doc]
            self.ids, self.doc, self.chars = self.ids[take], self.doc[take], self.chars[take]
        self.total = np.maximum(np.bincount(self.doc, weights=self.chars, minlength=self.n_docs), 1)
        self.cum = np.concatenate([[0], np.cumsum(self.chars)])
        # each word's document, and -1 past the last word: an n-gram running off the end of
        # the batch and one running into the next document are dropped by one comparison
        self.doc_or_end = np.append(self.doc, -1)


def _top_fraction(t: _Tokens, pos: np.ndarray, count: np.ndarray, width: int) -> np.ndarray:
    """Characters covered by each document's most frequent repeated n-gram, as a fraction."""
    sdoc = t.doc[pos]
    gram_chars = (t.cum[pos + width] - t.cum[pos]).astype(np.float64)
    best = _segment_max(count, sdoc, t.n_docs)
    is_top = (count == best[sdoc]) & (count > 1)
    return _segment_max(np.where(is_top, count * gram_chars, 0.0), sdoc, t.n_docs) / t.total


def _dup_fraction(t: _Tokens, pos: np.ndarray, count: np.ndarray, width: int) -> np.ndarray:
    """Characters of words inside any n-gram that occurs more than once, as a fraction.

    The union of the repeated n-grams' word spans, over those starts only (not every word): the
    starts are sorted, so each covers its words up to the next start or `width` words, and an
    n-gram never crosses its document's end."""
    starts = pos[count > 1]
    ends = starts + width
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    covered = (t.cum[ends] - t.cum[starts]).astype(np.float64)
    return np.bincount(t.doc[starts], weights=covered, minlength=t.n_docs) / t.total


def _grow(t: _Tokens, pos: np.ndarray, h: np.ndarray, width: int):
    """Extend each n-gram hash by one word, dropping starts that run past their document."""
    end = pos + width - 1  # <= len(t.ids): `pos` held a (width - 1)-gram inside the batch
    inside = t.doc_or_end[end] == t.doc[pos]
    pos, h, end = pos[inside], h[inside], end[inside]
    return pos, h * _PRIME + (t.ids[end] + 1).astype(np.uint64)


def ngram_fractions(
    words: Segments, docs: np.ndarray, top_ns: list[int], dup_ns: list[int], scale: int = 1
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Top and duplicate n-gram character fractions for the documents selected by `docs` (bool).

    For the selected documents, n is multiplied by `scale` (character tokens of CJK/Thai)."""
    t = _Tokens(words, docs)
    top_out = {n: np.zeros(t.n_docs) for n in top_ns}
    dup_out = {n: np.zeros(t.n_docs) for n in dup_ns}
    wanted = {n * scale: n for n in set(top_ns) | set(dup_ns)}
    # Grow n-grams one word at a time over a shrinking set of start positions: an (n+1)-gram can
    # only repeat where its n-gram prefix repeats, so after n = 2 only repeated starts stay active.
    pos = np.arange(len(t.ids))
    h = (t.ids + 1).astype(np.uint64) + t.doc.astype(np.uint64) * _DOC_MIX
    for width in range(2, max(wanted, default=1) + 1):
        pos, h = _grow(t, pos, h, width)
        if len(pos) == 0:
            break
        count = _occurrences(h)
        n = wanted.get(width)
        if n in top_out:
            top_out[n] = _top_fraction(t, pos, count, width)
        if n in dup_out:
            dup_out[n] = _dup_fraction(t, pos, count, width)
        repeated = count > 1
        pos, h = pos[repeated], h[repeated]
    for d in (top_out, dup_out):
        for n in d:
            d[n] = np.where(docs, d[n], 0.0)
    return top_out, dup_out
