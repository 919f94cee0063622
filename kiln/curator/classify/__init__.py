"""Corpus classifiers (NeMo Curator / DCLM style): a fastText quality classifier trained from
"high quality" text against a sample of the corpus, and a domain classifier from labelled
examples. `classify()` scores a corpus (here or in a Ray Data actor pool) and keeps documents
by threshold, top percentile or Pareto sampling.

    from kiln.curator.classify import ClassifyConfig, classify
    report = classify(ClassifyConfig(input=["corpus/"], high_quality=["wiki/"]), "out/")
"""

from kiln.curator.classify.config import ClassifyConfig
from kiln.platform.imports import lazy_exports

EXPORTS = {
    "FastTextClassifier": "kiln.curator.classify.fasttext_model:FastTextClassifier",
    "classify": "kiln.curator.classify.run:classify",
}
__getattr__ = lazy_exports(__name__, EXPORTS)

__all__ = ["ClassifyConfig", *EXPORTS]
