"""langid.py's naive-Bayes language identifier, run on a whole batch at once.

Same model and same features as `langid.classify` (the byte-level DFA that langid walks one byte
at a time in Python), but the DFA advances all documents in lock-step with numpy and the feature
counts become one sparse matrix product. Results equal `langid.classify` on the same bytes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import scipy.sparse as sp


class BatchLangid:
    def __init__(self, max_bytes: int = 1024):
        from langid.langid import LanguageIdentifier, model

        ident = LanguageIdentifier.from_modelstring(model, norm_probs=False)
        self.max_bytes = max_bytes
        self.nextmove = np.asarray(ident.tk_nextmove, dtype=np.int32)
        n_states = len(self.nextmove) >> 8
        rows, cols = [], []
        for state, feats in ident.tk_output.items():
            rows += [state] * len(feats)
            cols += list(feats)
        self.state_to_feat = sp.csr_matrix(
            (np.ones(len(rows)), (rows, cols)), shape=(n_states, ident.nb_numfeats)
        )
        self.n_states = n_states
        self.ptc = np.asarray(ident.nb_ptc)
        self.pc = np.asarray(ident.nb_pc)
        self.classes = np.asarray(ident.nb_classes)

    def features(self, texts: list[str]) -> sp.csr_matrix:
        data = [t.encode("utf-8")[: self.max_bytes] for t in texts]
        lens = np.fromiter(map(len, data), np.int64, len(data))
        width = int(lens.max()) if len(data) else 0
        # position-major so each lock-step reads one contiguous row
        mat = np.zeros((width, len(data)), dtype=np.int32)
        for i, b in enumerate(data):
            mat[: len(b), i] = np.frombuffer(b, dtype=np.uint8)
        state = np.zeros(len(data), dtype=np.int32)
        states = np.empty((width, len(data)), dtype=np.int32)
        for j in range(width):
            state = self.nextmove[(state << 8) | mat[j]]
            states[j] = state
        valid = np.arange(width)[:, None] < lens[None, :]
        docs = np.broadcast_to(np.arange(len(data))[None, :], states.shape)[valid]
        counts = sp.csr_matrix(
            (np.ones(len(docs), dtype=np.float32), (docs, states[valid])),
            shape=(len(data), self.n_states),
        )
        return counts @ self.state_to_feat

    def classify(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.array([], dtype=object)
        scores = np.asarray(self.features(texts) @ self.ptc) + self.pc
        return self.classes[np.argmax(scores, axis=1)]


@lru_cache(maxsize=4)
def batch_langid(max_bytes: int) -> BatchLangid:
    return BatchLangid(max_bytes)
