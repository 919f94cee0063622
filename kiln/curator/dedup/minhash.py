"""MinHash signatures over character n-grams, vectorised over a batch (numpy on CPU).

Two schemes, both with P[sig_a[k] == sig_b[k]] = Jaccard(a, b):
- `permutations`: k independent hash functions (multiply-shift), the minimum of each — what
  NeMo Curator / cuDF compute; cost O(shingles x k).
- `oph` (default): one-permutation hashing (Li et al. 2012) — each shingle falls into one of k
  bins and each bin keeps its minimum — with optimal densification of empty bins (Shrivastava
  2017); cost O(shingles), which is why it is the default on CPUs.
"""

from __future__ import annotations

import numpy as np

from kiln.curator.dedup.shingles import mix64, shingle_hashes

EMPTY = np.uint32(0xFFFFFFFF)


class MinHasher:
    def __init__(
        self, ngram: int = 24, bands: int = 20, rows: int = 13, seed: int = 42, scheme: str = "oph"
    ):
        self.ngram, self.bands, self.rows, self.seed, self.scheme = ngram, bands, rows, seed, scheme
        self.k = bands * rows
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**63, self.k, dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 2**63, self.k, dtype=np.uint64)
        # densification: attempt t of empty bin j borrows from bin probe[t, j]
        self.probe = rng.integers(0, self.k, (64, self.k))

    def signatures(self, texts: list[str]) -> np.ndarray:
        """[len(texts), k] uint32 signatures."""
        if not texts:
            return np.zeros((0, self.k), dtype=np.uint32)
        h, doc = shingle_hashes(texts, self.ngram, self.seed)
        if self.scheme == "permutations":
            return self._permutations(h, doc, len(texts))
        return self._oph(h, doc, len(texts))

    def _permutations(self, h, doc, n_docs):
        first = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
        sig = np.empty((n_docs, self.k), dtype=np.uint32)
        for j in range(self.k):
            v = ((h * self.a[j] + self.b[j]) >> np.uint64(32)).astype(np.uint32)
            sig[:, j] = np.minimum.reduceat(v, first)
        return sig

    def _oph(self, h, doc, n_docs):
        k = self.k
        bins = (((h >> np.uint64(32)) * np.uint64(k)) >> np.uint64(32)).astype(np.int64)
        vals = (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        flat = np.full(n_docs * k, EMPTY, dtype=np.uint32)
        key = doc * k + bins
        np.minimum.at(flat, key, vals)
        filled = np.zeros(n_docs * k, dtype=bool)
        filled[key] = True
        sig, filled = flat.reshape(n_docs, k), filled.reshape(n_docs, k)
        out = sig.copy()
        d, j = np.nonzero(~filled)
        for t in range(self.probe.shape[0]):
            if len(d) == 0:
                break
            src = self.probe[t, j]
            hit = filled[d, src]
            out[d[hit], j[hit]] = sig[d[hit], src[hit]]
            d, j = d[~hit], j[~hit]
        if len(d):  # very sparse documents: a value derived from the document's smallest bin
            low = np.where(filled, sig, EMPTY).min(axis=1)
            out[d, j] = (
                mix64(low[d].astype(np.uint64) * np.uint64(k) + j.astype(np.uint64))
                >> np.uint64(32)
            ).astype(np.uint32)
        return out

    def band_hashes(self, sig: np.ndarray) -> np.ndarray:
        """[n, bands] uint64 bucket keys: each band's rows hashed together."""
        n = sig.shape[0]
        bands = sig.reshape(n, self.bands, self.rows).astype(np.uint64)
        # seeding each band differently keeps buckets of different bands apart
        acc = np.broadcast_to(
            mix64(np.arange(1, self.bands + 1, dtype=np.uint64)), (n, self.bands)
        ).copy()
        for r in range(self.rows):
            acc = mix64(acc ^ bands[:, :, r])
        return acc
