"""The filter interface. A filter sees a whole `DocBatch` and answers, vectorised, which to keep.

Write your own in a few lines and list it in the config (`filters.custom: ["mypkg.mod:NoShouting"]`)
or pass an instance to `curate(..., extra_filters=[...])`:

    class NoShouting(DocumentFilter):
        name = "shouting"
        def keep(self, batch):
            upper = batch.count(r"\\p{Lu}")
            return upper <= 0.5 * batch.count(r"\\pL")
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from kiln.curator.filters.batch import DocBatch


class DocumentFilter:
    name: ClassVar[str] = ""

    def keep(self, batch: DocBatch) -> np.ndarray:
        """A boolean array, True for documents that pass."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class Bounds(DocumentFilter):
    """Keep documents whose statistic lies in [low, high]; either bound may be None."""

    def __init__(self, low: float | None, high: float | None):
        self.low, self.high = low, high

    def statistic(self, batch: DocBatch) -> np.ndarray:
        raise NotImplementedError

    def applies(self, batch: DocBatch) -> np.ndarray:
        """Documents the rule is meaningful for; the others pass."""
        return np.ones(len(batch), dtype=bool)

    def keep(self, batch: DocBatch) -> np.ndarray:
        value = self.statistic(batch)
        ok = np.ones(len(batch), dtype=bool)
        if self.low is not None:
            ok &= value >= self.low
        if self.high is not None:
            ok &= value <= self.high
        return ok | ~self.applies(batch)
