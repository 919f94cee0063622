"""A fastText classifier as an artifact: `model.bin` plus `meta.json` (labels, held-out accuracy).

Text is made fastText-ready the way that works without spaces: lowercased, one line, and every
Han/kana/Thai character a token of its own, so word bigrams are Japanese character bigrams.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import tempfile

import numpy as np

from kiln.curator.classify.config import FastTextConfig
from kiln.platform.errors import InputError

_CJK = re.compile(r"([\u0e00-\u0e7f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff])")
_SPACE = re.compile(r"\s+")
PREFIX = "__label__"


def fasttext_text(text: str, max_chars: int) -> str:
    return _SPACE.sub(" ", _CJK.sub(r" \1 ", text[:max_chars].lower())).strip()


class FastTextClassifier:
    def __init__(self, model, labels: list[str], meta: dict):
        self.model, self.labels, self.meta = model, labels, meta
        self.max_chars = meta.get("max_chars", 20_000)

    @classmethod
    def train(
        cls, texts: list[str], labels: list[str], cfg: FastTextConfig, held_out: float, seed: int
    ) -> FastTextClassifier:
        """Train on a seeded split and measure accuracy on the held-out part."""
        import fasttext

        if len(set(labels)) < 2:
            raise InputError("classify: training data needs at least two labels")
        order = list(range(len(texts)))
        random.Random(seed).shuffle(order)
        n_test = max(1, int(len(order) * held_out))
        test, train = order[:n_test], order[n_test:]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "train.txt")
            with open(path, "w", encoding="utf-8") as f:
                for i in train:
                    f.write(f"{PREFIX}{labels[i]} {fasttext_text(texts[i], cfg.max_chars)}\n")
            model = fasttext.train_supervised(
                input=path,
                dim=cfg.dim,
                epoch=cfg.epoch,
                lr=cfg.lr,
                wordNgrams=cfg.word_ngrams,
                minn=cfg.minn,
                maxn=cfg.maxn,
                bucket=cfg.bucket,
                thread=1,  # one thread: the same model for the same seed
                seed=seed,
                verbose=0,
            )
        names = sorted(lab[len(PREFIX) :] for lab in model.labels)
        meta = {"labels": names, "max_chars": cfg.max_chars, "train_docs": len(train)}
        clf = cls(model, names, meta)
        pred = clf.predict([texts[i] for i in test])[0]
        clf.meta["held_out_docs"] = len(test)
        clf.meta["held_out_accuracy"] = float(np.mean(pred == np.array([labels[i] for i in test])))
        return clf

    def predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(best label per text, probability matrix with columns in `labels` order)."""
        lines = [fasttext_text(t, self.max_chars) for t in texts]
        got_labels, got_probs = self.model.predict(lines, k=len(self.labels))
        column = {f"{PREFIX}{name}": j for j, name in enumerate(self.labels)}
        probs = np.zeros((len(texts), len(self.labels)))
        for i, (labs, ps) in enumerate(zip(got_labels, got_probs, strict=True)):
            probs[i, [column[lab] for lab in labs]] = ps
        best = np.array(self.labels, dtype=object)[probs.argmax(axis=1)] if len(texts) else []
        return np.asarray(best, dtype=object), probs

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.model.save_model(os.path.join(folder, "model.bin"))
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(self.meta, f, indent=2)

    @classmethod
    def load(cls, folder: str) -> FastTextClassifier:
        import fasttext

        try:
            with open(os.path.join(folder, "meta.json")) as f:
                meta = json.load(f)
            # fastText prints a deprecation notice on stderr at every load: not the user's concern
            with contextlib.redirect_stderr(io.StringIO()):
                model = fasttext.load_model(os.path.join(folder, "model.bin"))
        except (OSError, ValueError):
            raise InputError(
                f"{folder}: not a classifier folder (expected model.bin and meta.json)"
            ) from None
        return cls(model, meta["labels"], meta)
