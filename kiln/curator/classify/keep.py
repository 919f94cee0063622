"""Which scored documents stay: threshold, top percentile or Pareto sampling, and the histogram."""

from __future__ import annotations

import hashlib

import numpy as np

from kiln.curator.classify.config import KeepConfig


def uniform_per_doc(ids: list[str], seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per document from its id and the seed: the same document gets
    the same draw whatever the batch, actor or order (so Ray and local runs agree)."""
    raw = b"".join(hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest() for i in ids)
    return (np.frombuffer(raw, dtype="<u8") >> np.uint64(11)) / float(1 << 53)


def pareto_keep(scores: np.ndarray, ids: list[str], alpha: float, seed: int) -> np.ndarray:
    """NeMo Curator's `np.random.pareto(alpha) > 1 - score`, drawn by inverse CDF per document."""
    draw = (1.0 - uniform_per_doc(ids, seed)) ** (-1.0 / alpha) - 1.0
    return draw > 1.0 - scores


def cutoff(all_scores: np.ndarray, cfg: KeepConfig) -> float:
    """The score a document needs under `threshold` / `top_percent` (ties at the cut stay)."""
    if cfg.method == "top_percent" and len(all_scores):
        k = max(1, int(np.ceil(len(all_scores) * cfg.top_percent / 100)))
        return float(np.sort(all_scores)[::-1][k - 1])
    return cfg.threshold


def keep_mask(
    scores: np.ndarray, ids: list[str], cfg: KeepConfig, cut: float, seed: int
) -> np.ndarray:
    if cfg.method == "all":
        return np.ones(len(scores), dtype=bool)
    if cfg.method == "pareto":
        return pareto_keep(scores, ids, cfg.alpha, seed)
    return scores >= cut


def histogram(scores: np.ndarray, bins: int, span: tuple[float, float] | None = None) -> dict:
    """Counts over `bins` equal bins of [0, 1] (or of `span`); non-finite scores are left out."""
    scores = scores[np.isfinite(scores)]
    counts, edges = np.histogram(scores, bins=bins, range=span or (0.0, 1.0))
    return {"edges": [round(float(e), 6) for e in edges], "counts": counts.tolist()}
