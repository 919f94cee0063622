"""C4 rules (Raffel et al. 2020): terminal punctuation, "lorem ipsum", "javascript", braces."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from kiln.curator.filters.base import Bounds, DocumentFilter

TERMINAL = r"[.!?。！？」』”\"'…:;)]$"


class TerminalPunctuation(Bounds):
    name = "terminal_punctuation"

    def statistic(self, batch):
        return batch.line_ratio(TERMINAL)


class LoremIpsum(DocumentFilter):
    name = "lorem_ipsum"

    def keep(self, batch):
        return ~pc.match_substring(batch.lower, "lorem ipsum").to_numpy(zero_copy_only=False)


class Javascript(Bounds):
    """Pages dominated by 'enable JavaScript' notices."""

    name = "javascript"

    def statistic(self, batch):
        return batch.line_ratio(r"(?i)javascript")


class CurlyBraces(Bounds):
    """C4 drops any page with '{'; a small ratio keeps prose that quotes a little code."""

    name = "curly_braces"

    def statistic(self, batch):
        return batch.ratio(batch.count_chars(r"{}"), batch.n_chars)


class UrlRatio(Bounds):
    name = "url_ratio"
    PATTERN = r"(?:https?://|www\.)[^\s<>\"]+"

    def statistic(self, batch):
        arr = batch.arr
        has = pc.match_substring_regex(arr, self.PATTERN).to_numpy(zero_copy_only=False)
        url_chars = np.zeros(len(batch))
        if has.any():
            import re

            pattern = re.compile(self.PATTERN)
            for i in np.nonzero(has)[0]:
                url_chars[i] = sum(len(m) for m in pattern.findall(batch.texts[i]))
        return batch.ratio(url_chars, batch.n_chars)
