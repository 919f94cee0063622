"""The trained classifiers behind `kind: quality | domain`: fastText over n-grams, or a head over
sentence embeddings (`classifier: embedding`). Both predict (best label, probabilities) and live
in a folder whose `meta.json` names which one it is."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.fasttext_model import FastTextClassifier
from kiln.platform.errors import InputError
from kiln.platform.imports import import_object

if TYPE_CHECKING:
    from kiln.curator.classify.embedding_model import EmbeddingClassifier

    Classifier = FastTextClassifier | EmbeddingClassifier
else:
    Classifier = FastTextClassifier  # or an EmbeddingClassifier, imported on use

# The embedding classifier brings torch (~2 s to import): named by import path and imported when
# one is trained or loaded, so curate's filter actors (fastText at most) start without it.
EMBEDDING = "embedding"  # `classifier:` and meta.json's value (embedding_model.KIND)
EMBEDDING_CLASSIFIER = "kiln.curator.classify.embedding_model:EmbeddingClassifier"


def train_classifier(cfg: ClassifyConfig, texts: list[str], labels: list[str]) -> Classifier:
    if cfg.classifier == EMBEDDING:
        embedding = import_object(EMBEDDING_CLASSIFIER)
        return embedding.train(texts, labels, cfg.embedding, cfg.held_out, cfg.seed)
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
    if meta.get("classifier") == EMBEDDING:
        return import_object(EMBEDDING_CLASSIFIER).load(folder, meta)
    return FastTextClassifier.load(folder)
