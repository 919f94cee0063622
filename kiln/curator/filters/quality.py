"""A trained quality classifier (`kiln classify`: fastText or embedding) as a curate filter step:
documents whose P(high quality) is under the threshold — or that lose NeMo Curator's Pareto
draw — are rejected as `quality`. The model is loaded once per streaming actor."""

from __future__ import annotations

import numpy as np

from kiln.curator.classify.classifiers import load_classifier
from kiln.curator.classify.keep import pareto_keep
from kiln.curator.filters.base import DocumentFilter
from kiln.curator.filters.batch import DocBatch


class QualityFilter(DocumentFilter):
    name = "quality"

    def __init__(self, model_dir: str, threshold: float = 0.5, pareto_alpha: float | None = None):
        self.clf = load_classifier(model_dir)
        self.high = self.clf.labels.index("high") if "high" in self.clf.labels else 0
        self.threshold, self.alpha = threshold, pareto_alpha

    def scores(self, batch: DocBatch) -> np.ndarray:
        return self.clf.predict(batch.texts)[1][:, self.high]

    def keep(self, batch: DocBatch) -> np.ndarray:
        score = self.scores(batch)
        if self.alpha is None:
            return score >= self.threshold

        return pareto_keep(score, batch.texts, self.alpha, seed=0)
