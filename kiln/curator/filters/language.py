"""Language identification with langid's bundled model (nothing downloaded) and a keep-list."""

from __future__ import annotations

import numpy as np

from kiln.curator.filters.base import DocumentFilter
from kiln.curator.filters.batch import DocBatch
from kiln.curator.filters.langid_batch import batch_langid


class Language(DocumentFilter):
    name = "language"

    def __init__(self, languages: list[str], max_bytes: int = 1024):
        self.languages = set(languages)
        self.max_bytes = max_bytes

    def detect(self, batch: DocBatch) -> np.ndarray:
        if "language" not in batch.__dict__:
            batch.__dict__["language"] = batch_langid(self.max_bytes).classify(batch.texts)
        return batch.__dict__["language"]

    def keep(self, batch):
        return np.isin(self.detect(batch), list(self.languages))
