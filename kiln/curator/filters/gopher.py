"""Gopher quality and repetition rules (Rae et al. 2021); CJK/kana/Thai characters are one word
each (see `DocBatch.words`), n-grams of unspaced documents are `no_space_scale` times longer;
Japanese documents split by the tokenizer count its words, n-grams unscaled."""

from __future__ import annotations

import numpy as np

from kiln.curator.filters.base import Bounds, DocumentFilter
from kiln.curator.filters.batch import DocBatch
from kiln.curator.filters.repetition import duplicate_fractions, ngram_fractions


class WordCount(Bounds):
    name = "word_count"

    def statistic(self, batch):
        return batch.n_words


class MeanWordLength(Bounds):
    """Spaced scripts: over the words that are not CJK/kana/Thai characters (one-character words
    by construction, which would drag a mixed English/Japanese page under the minimum).
    Japanese documents split by the tokenizer (`batch.segmented`): over all their words, with
    the Japanese bounds `ja_low`/`ja_high` (Japanese words are shorter)."""

    name = "mean_word_length"

    def __init__(self, low, high, ja_low: float | None = None, ja_high: float | None = None):
        super().__init__(low, high)
        self.ja_low, self.ja_high = ja_low, ja_high

    def statistic(self, batch):
        words = batch.words
        spaced = ~words.cjk | batch.segmented[words.doc]
        return batch.ratio(words.per_doc(words.chars * spaced), words.per_doc(spaced))

    def applies(self, batch):
        return ~batch.no_space

    def keep(self, batch):
        ok = super().keep(batch)
        if not batch.segmented.any():
            return ok
        value = self.statistic(batch)
        if self.ja_low is not None:
            ok &= ~batch.segmented | (value >= self.ja_low)
        if self.ja_high is not None:
            ok &= ~batch.segmented | (value <= self.ja_high)
        return ok


class SymbolWordRatio(Bounds):
    name = "symbol_word_ratio"

    def statistic(self, batch):
        return batch.ratio(batch.count(r"#|\.\.\.|…"), batch.n_words)


class BulletLines(Bounds):
    name = "bullet_lines"

    def statistic(self, batch):
        return batch.line_ratio(r"^[•●○▪▫◦‣⁃·∙\-\*]")


class EllipsisLines(Bounds):
    name = "ellipsis_lines"

    def statistic(self, batch):
        return batch.line_ratio(r"(\.\.\.|…)$")


class AlphaWords(Bounds):
    """Share of words with at least one letter (Gopher's 80% rule)."""

    name = "alpha_words"

    def statistic(self, batch):
        words = batch.words
        return batch.ratio(words.per_doc(words.alpha.astype(np.float64)), batch.n_words)


class NonAlnumRatio(Bounds):
    name = "non_alphanumeric"

    def statistic(self, batch):
        # the other characters counted as matches: fewer than the letters, digits and spaces
        return batch.ratio(batch.count(r"[^\pL\pN\s]"), batch.n_chars)


class DigitRatio(Bounds):
    name = "digits"

    def statistic(self, batch):
        return batch.ratio(batch.count(r"\pN"), batch.n_chars)  # rare: counted as matches


class DuplicateLines(DocumentFilter):
    name = "duplicate_lines"

    def __init__(
        self, max_fraction: float | None, max_char_fraction: float | None, paragraphs: bool = False
    ):
        self.max_fraction, self.max_char_fraction, self.paragraphs = (
            max_fraction,
            max_char_fraction,
            paragraphs,
        )

    def keep(self, batch):
        frac, char_frac = duplicate_fractions(batch.paragraphs if self.paragraphs else batch.lines)
        ok = np.ones(len(batch), dtype=bool)
        if self.max_fraction is not None:
            ok &= frac <= self.max_fraction
        if self.max_char_fraction is not None:
            ok &= char_frac <= self.max_char_fraction
        return ok


class DuplicateParagraphs(DuplicateLines):
    name = "duplicate_paragraphs"

    def __init__(self, max_fraction, max_char_fraction):
        super().__init__(max_fraction, max_char_fraction, paragraphs=True)


class _NgramRule(DocumentFilter):
    """Shared n-gram statistics for spaced and unspaced (n scaled) documents.

    `companion_ns` are the n of the other n-gram rule (top <-> duplicate): the first of the two
    rules to run computes both kinds in one pass over the batch, the second reads them (both grow
    the same n-grams from n = 2, which is most of the cost)."""

    kind = ""

    def __init__(
        self, limits: dict[int, float], no_space_scale: int = 4, companion_ns: tuple[int, ...] = ()
    ):
        self.limits, self.scale = {int(k): v for k, v in limits.items()}, no_space_scale
        self.companion_ns = tuple(sorted(int(n) for n in companion_ns))

    def _fractions(self, batch: DocBatch, docs: np.ndarray, scale: int):
        own, other = tuple(sorted(self.limits)), self.companion_ns
        top_ns, dup_ns = (own, other) if self.kind == "top" else (other, own)
        key = ("ngram_fractions", scale, top_ns, dup_ns)
        if key not in batch.__dict__:
            batch.__dict__[key] = ngram_fractions(
                batch.words, docs, list(top_ns), list(dup_ns), scale
            )
        return batch.__dict__[key]

    def keep(self, batch: DocBatch):
        ok = np.ones(len(batch), dtype=bool)
        by_char = batch.no_space & ~batch.segmented  # one word per character: longer n-grams
        for docs, scale in ((~by_char, 1), (by_char, self.scale)):
            if not docs.any():
                continue
            top, dup = self._fractions(batch, docs, scale)
            for n, limit in self.limits.items():
                ok &= (top if self.kind == "top" else dup)[n] <= limit
        return ok


class TopNgrams(_NgramRule):
    name = "top_ngrams"
    kind = "top"


class DuplicateNgrams(_NgramRule):
    name = "duplicate_ngrams"
    kind = "dup"
