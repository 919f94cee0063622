"""Corpus classifiers (NeMo Curator / DCLM style): a fastText quality classifier trained from
"high quality" text against a sample of the corpus, and a domain classifier from labelled
examples. `classify()` scores a corpus (here or in a Ray Data actor pool) and keeps documents
by threshold, top percentile or Pareto sampling.

    from kiln.curator.classify import ClassifyConfig, classify
    report = classify(ClassifyConfig(input=["corpus/"], high_quality=["wiki/"]), "out/")
"""

from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.fasttext_model import FastTextClassifier


def classify(cfg: ClassifyConfig, output_dir: str) -> dict:
    from kiln.curator.classify.run import classify as _classify

    return _classify(cfg, output_dir)


__all__ = ["ClassifyConfig", "FastTextClassifier", "classify"]
