"""Document filters: URL blocklists, code rules, Gopher quality and repetition rules, C4 rules,
URL ratio, language id, eval-set decontamination, plus any user `DocumentFilter`. Each filter is
counted under its `name` in report.json."""

from __future__ import annotations

import importlib

from kiln.curator.config import FilterConfig
from kiln.curator.filters import c4, gopher
from kiln.curator.filters.base import Bounds, DocumentFilter
from kiln.curator.filters.batch import DocBatch
from kiln.curator.filters.code import code_filters
from kiln.curator.filters.decontam import Decontaminate
from kiln.curator.filters.language import Language
from kiln.curator.filters.quality import QualityFilter
from kiln.curator.filters.url_blocklist import UrlBlocklist
from kiln.platform.errors import ConfigError


def load_custom(spec: str) -> DocumentFilter:
    module, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(
            f"filters.custom: cannot import {spec!r} (expected 'package.module:Class')"
        ) from None
    obj = cls() if isinstance(cls, type) else cls
    if not isinstance(obj, DocumentFilter) or not obj.name:
        raise ConfigError(f"filters.custom: {spec!r} is not a DocumentFilter with a name")
    return obj


def build_filters(cfg: FilterConfig, extra: list[DocumentFilter] = ()) -> list[DocumentFilter]:
    """The configured filters in the order they are applied (first failure names the reason)."""
    out: list[DocumentFilter] = []

    def add(cond: bool, f: DocumentFilter) -> None:
        if cond:
            out.append(f)

    if cfg.url_blocklist:
        out.append(UrlBlocklist.from_config(cfg.url_blocklist))
    if cfg.code is not None:
        out += code_filters(cfg.code)

    add(
        cfg.min_words is not None or cfg.max_words is not None,
        gopher.WordCount(cfg.min_words, cfg.max_words),
    )
    add(
        cfg.min_mean_word_length is not None or cfg.max_mean_word_length is not None,
        gopher.MeanWordLength(
            cfg.min_mean_word_length,
            cfg.max_mean_word_length,
            cfg.ja_min_mean_word_length,
            cfg.ja_max_mean_word_length,
        ),
    )
    add(
        cfg.max_symbol_word_ratio is not None,
        gopher.SymbolWordRatio(None, cfg.max_symbol_word_ratio),
    )
    add(cfg.max_bullet_line_ratio is not None, gopher.BulletLines(None, cfg.max_bullet_line_ratio))
    add(
        cfg.max_ellipsis_line_ratio is not None,
        gopher.EllipsisLines(None, cfg.max_ellipsis_line_ratio),
    )
    add(cfg.min_alpha_word_ratio is not None, gopher.AlphaWords(cfg.min_alpha_word_ratio, None))
    add(cfg.max_non_alnum_ratio is not None, gopher.NonAlnumRatio(None, cfg.max_non_alnum_ratio))
    add(cfg.max_digit_ratio is not None, gopher.DigitRatio(None, cfg.max_digit_ratio))
    add(
        cfg.max_dup_line_fraction is not None or cfg.max_dup_line_char_fraction is not None,
        gopher.DuplicateLines(cfg.max_dup_line_fraction, cfg.max_dup_line_char_fraction),
    )
    add(
        cfg.max_dup_para_fraction is not None or cfg.max_dup_para_char_fraction is not None,
        gopher.DuplicateParagraphs(cfg.max_dup_para_fraction, cfg.max_dup_para_char_fraction),
    )
    top, dup = cfg.top_ngram_char_fraction or {}, cfg.dup_ngram_char_fraction or {}
    # each knows the other's n: the first to run computes both in one pass
    add(bool(top), gopher.TopNgrams(top, cfg.no_space_ngram_scale, tuple(dup)))
    add(bool(dup), gopher.DuplicateNgrams(dup, cfg.no_space_ngram_scale, tuple(top)))
    add(
        cfg.min_terminal_punct_line_ratio is not None,
        c4.TerminalPunctuation(cfg.min_terminal_punct_line_ratio, None),
    )
    add(cfg.lorem_ipsum, c4.LoremIpsum())
    add(
        cfg.max_javascript_line_ratio is not None,
        c4.Javascript(None, cfg.max_javascript_line_ratio),
    )
    add(cfg.max_curly_brace_ratio is not None, c4.CurlyBraces(None, cfg.max_curly_brace_ratio))
    add(cfg.max_url_char_ratio is not None, c4.UrlRatio(None, cfg.max_url_char_ratio))
    add(bool(cfg.languages), Language(cfg.languages or [], cfg.language_bytes))
    if cfg.decontaminate:
        out.append(
            Decontaminate.from_files(
                cfg.decontaminate, cfg.decontaminate_ngram, cfg.decontaminate_min_ngram
            )
        )
    if cfg.quality_model:
        out.append(
            QualityFilter(cfg.quality_model, cfg.quality_threshold, cfg.quality_pareto_alpha)
        )
    out += [load_custom(s) for s in cfg.custom]
    out += list(extra)
    return out


__all__ = [
    "Bounds",
    "Decontaminate",
    "DocBatch",
    "DocumentFilter",
    "Language",
    "build_filters",
    "load_custom",
]
