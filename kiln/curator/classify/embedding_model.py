"""A learned classifier over sentence embeddings (FineWeb-Edu's recipe with a frozen encoder): the
encoder's unit vectors, then a logistic-regression or one-hidden-layer MLP head trained with
full-batch L-BFGS on a seeded split. As an artifact: `head.safetensors` plus `meta.json` (the
encoder, labels, held-out accuracy); the encoder itself is named, not copied.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from kiln.curator.classify.config import EmbeddingConfig
from kiln.curator.classify.encoders import Encoder, load_encoder
from kiln.platform.errors import InputError

KIND = "embedding"


def build_head(dim: int, n_labels: int, hidden: int) -> torch.nn.Module:
    if hidden:
        return torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, n_labels)
        )
    return torch.nn.Linear(dim, n_labels)


def fit_head(
    x: torch.Tensor, y: torch.Tensor, n_labels: int, cfg: EmbeddingConfig, seed: int
) -> torch.nn.Module:
    """Cross-entropy + L2 minimised by full-batch L-BFGS: no mini-batch order, so a seed and the
    data fix the head. A linear head starts at zero (the problem is convex)."""
    gen = torch.Generator().manual_seed(seed)
    head = build_head(x.shape[1], n_labels, cfg.hidden)
    with torch.no_grad():
        for p in head.parameters():
            if cfg.hidden and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            else:
                p.zero_()
    opt = torch.optim.LBFGS(
        head.parameters(), lr=1.0, max_iter=cfg.steps, line_search_fn="strong_wolfe"
    )
    weights = [p for p in head.parameters() if p.dim() == 2]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(x), y)
        loss = loss + cfg.weight_decay * sum((w * w).sum() for w in weights)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return head.eval()


class EmbeddingClassifier:
    def __init__(self, encoder: Encoder, head: torch.nn.Module, labels: list[str], meta: dict):
        self.encoder, self.head, self.labels, self.meta = encoder, head, labels, meta

    @classmethod
    def train(
        cls,
        texts: list[str],
        labels: list[str],
        cfg: EmbeddingConfig,
        held_out: float,
        seed: int,
    ) -> EmbeddingClassifier:
        """Train on a seeded split (the same split fastText's training draws) and measure accuracy
        on the held-out part."""
        names = sorted(set(labels))
        if len(names) < 2:
            raise InputError("classify: training data needs at least two labels")
        order = list(range(len(texts)))
        random.Random(seed).shuffle(order)
        n_test = max(1, int(len(order) * held_out))
        test, train = order[:n_test], order[n_test:]
        encoder = load_encoder(cfg)
        x = torch.from_numpy(encoder([texts[i] for i in train]))
        y = torch.tensor([names.index(labels[i]) for i in train])
        head = fit_head(x, y, len(names), cfg, seed)
        meta = {
            "classifier": KIND,
            "labels": names,
            "embedding": cfg.model_dump(),
            "train_docs": len(train),
        }
        clf = cls(encoder, head, names, meta)
        pred = clf.predict([texts[i] for i in test])[0]
        clf.meta["held_out_docs"] = len(test)
        clf.meta["held_out_accuracy"] = float(np.mean(pred == np.array([labels[i] for i in test])))
        return clf

    def predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(best label per text, probability matrix with columns in `labels` order)."""
        if not texts:
            return np.array([], dtype=object), np.zeros((0, len(self.labels)))
        with torch.inference_mode():
            logits = self.head(torch.from_numpy(self.encoder(texts)))
            probs = torch.softmax(logits.double(), dim=-1).numpy()
        return np.array(self.labels, dtype=object)[probs.argmax(axis=1)], probs

    def save(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.head.state_dict().items()}
        save_file(state, os.path.join(folder, "head.safetensors"))
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(self.meta, f, indent=2)

    @classmethod
    def load(cls, folder: str, meta: dict) -> EmbeddingClassifier:
        cfg = EmbeddingConfig.model_validate(meta["embedding"])
        try:
            state = load_file(os.path.join(folder, "head.safetensors"))
        except (OSError, ValueError):
            raise InputError(
                f"{folder}: no readable head.safetensors (an embedding classifier)"
            ) from None
        first = state["0.weight" if cfg.hidden else "weight"]
        head = build_head(first.shape[1], len(meta["labels"]), cfg.hidden)
        head.load_state_dict(state)
        encoder = load_encoder(cfg)
        return cls(encoder, head.eval(), meta["labels"], meta)
