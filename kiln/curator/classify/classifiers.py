"""The trained classifiers behind `kind: quality | domain`: fastText over n-grams, or a head over
sentence embeddings (`classifier: embedding`). Both predict (best label, probabilities) and live
in a folder whose `meta.json` names which one it is."""

from __future__ import annotations

import json
import os

from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.embedding_model import KIND, EmbeddingClassifier
from kiln.curator.classify.fasttext_model import FastTextClassifier
from kiln.platform.errors import InputError

Classifier = FastTextClassifier | EmbeddingClassifier


def train_classifier(cfg: ClassifyConfig, texts: list[str], labels: list[str]) -> Classifier:
    if cfg.classifier == KIND:
        return EmbeddingClassifier.train(texts, labels, cfg.embedding, cfg.held_out, cfg.seed)
    return FastTextClassifier.train(texts, labels, cfg.fasttext, cfg.held_out, cfg.seed)


def load_classifier(folder: str) -> Classifier:
    """The classifier saved in `folder` (`kiln classify`'s `model/`), whichever kind it is."""
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        raise InputError(
            f"{folder}: not a classifier folder (expected meta.json and model.bin or "
            "head.safetensors)"
        ) from None
    if meta.get("classifier") == KIND:
        return EmbeddingClassifier.load(folder, meta)
    return FastTextClassifier.load(folder)
