"""Filters for source code, after NeMo Curator's code filters and StarCoder's (Li et al. 2023):
number of lines, longest line, mean line length, alphabetic fraction, comment ratio and
mis-labelled XML. Lines are the raw `\\n`-separated lines (blank ones count), as those tools do.

Comments are found with one language-agnostic pattern: `#` followed by a space (so `#include` and
`#!` are code), `//` at a line start or after a space (so `http://` is not), `/* ... */` blocks
and Python docstrings. The comment ratio is comment characters over all characters.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from kiln.curator.filters.base import Bounds
from kiln.curator.filters.batch import DocBatch

COMMENT = (
    r"(?s:/\*.*?\*/)|(?s:\"\"\".*?\"\"\")|(?s:'''.*?''')"
    r"|(?m:(?:^|[ \t])(?:#(?:[ \t#]|$)|//)[^\n]*)"
)


def _np(arr) -> np.ndarray:
    return arr.to_numpy(zero_copy_only=False)


def raw_line_lengths(batch: DocBatch) -> tuple[np.ndarray, np.ndarray]:
    """(characters of every `\\n`-separated line, its document)."""
    lists = pc.split_pattern(batch.arr, "\n")
    lengths = _np(pc.utf8_length(pc.list_flatten(lists))).astype(np.int64)
    doc = np.repeat(np.arange(len(batch)), _np(pc.list_value_length(lists)))
    return lengths, doc


class CodeLines(Bounds):
    name = "code_lines"

    def statistic(self, batch):
        return batch.count("\n") + 1


class CodeMaxLineLength(Bounds):
    name = "code_max_line_length"

    def statistic(self, batch):
        lengths, doc = raw_line_lengths(batch)
        out = np.zeros(len(batch), dtype=np.int64)
        np.maximum.at(out, doc, lengths)
        return out


class CodeMeanLineLength(Bounds):
    name = "code_mean_line_length"

    def statistic(self, batch):
        lines = batch.count("\n") + 1
        return (batch.n_chars - (lines - 1)) / lines


class CodeAlpha(Bounds):
    """Files that are mostly numbers or symbols: tensors, tables, minified data."""

    name = "code_alpha"

    def statistic(self, batch):
        return batch.ratio(batch.count_chars(r"\pL"), batch.n_chars)


class CodeCommentRatio(Bounds):
    name = "code_comment_ratio"

    def statistic(self, batch):
        return batch.ratio(batch.n_chars - comment_free_chars(batch), batch.n_chars)


def comment_free_chars(batch: DocBatch) -> np.ndarray:
    return _np(pc.utf8_length(pc.replace_substring_regex(batch.arr, COMMENT, ""))).astype(np.int64)


class CodeXmlHeader(Bounds):
    """Files with a wrong extension that are really XML (StarCoder): an XML declaration near the
    start."""

    name = "code_xml_header"

    def __init__(self, prefix_chars: int = 100):
        super().__init__(None, 0)
        self.prefix_chars = prefix_chars

    def statistic(self, batch):
        head = pc.utf8_slice_codeunits(batch.arr, 0, self.prefix_chars)
        return _np(pc.match_substring(head, "<?xml version=")).astype(np.int64)


def code_filters(cfg) -> list[Bounds]:
    """The configured code rules (a `CodeFilterConfig`) in the order they are applied."""
    rules: list[tuple[bool, Bounds]] = [
        (
            cfg.min_lines is not None or cfg.max_lines is not None,
            CodeLines(cfg.min_lines, cfg.max_lines),
        ),
        (cfg.xml_header, CodeXmlHeader()),
        (cfg.max_line_length is not None, CodeMaxLineLength(None, cfg.max_line_length)),
        (
            cfg.max_mean_line_length is not None,
            CodeMeanLineLength(None, cfg.max_mean_line_length),
        ),
        (cfg.min_alpha_fraction is not None, CodeAlpha(cfg.min_alpha_fraction, None)),
        (
            cfg.min_comment_ratio is not None or cfg.max_comment_ratio is not None,
            CodeCommentRatio(cfg.min_comment_ratio, cfg.max_comment_ratio),
        ),
    ]
    return [f for on, f in rules if on]
