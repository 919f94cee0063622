"""langid.py's naive-Bayes language identifier, run on a whole batch at once.

Same model and same features as `langid.classify` (the byte-level DFA that langid walks one byte
at a time in Python), but the DFA advances all documents in lock-step with numpy and the feature
counts become one sparse matrix product. Results equal `langid.classify` on the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from functools import lru_cache

import numpy as np
import scipy.sparse as sp


class BatchLangid:
    def __init__(self, max_bytes: int = 1024):
        self.max_bytes = max_bytes
        arrays = _model_arrays()
        self.nextmove = arrays["nextmove"]
        self.n_states = len(self.nextmove) >> 8
        self.state_to_feat = sp.csr_matrix(
            (arrays["feat_data"], arrays["feat_indices"], arrays["feat_indptr"]),
            shape=(self.n_states, int(arrays["n_feats"])),
        )
        self.ptc = arrays["ptc"]
        self.pc = arrays["pc"]
        self.classes = arrays["classes"]

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


def _build_arrays(model: str) -> dict[str, np.ndarray]:
    """langid's model string (bz2 + base64 pickle: ~6 s of CPU to unpack) as flat arrays."""
    from langid.langid import LanguageIdentifier

    ident = LanguageIdentifier.from_modelstring(model, norm_probs=False)
    nextmove = np.asarray(ident.tk_nextmove, dtype=np.int32)
    rows, cols = [], []
    for state, feats in ident.tk_output.items():
        rows += [state] * len(feats)
        cols += list(feats)
    feat = sp.csr_matrix(
        (np.ones(len(rows)), (rows, cols)), shape=(len(nextmove) >> 8, ident.nb_numfeats)
    )
    return {
        "nextmove": nextmove,
        "feat_data": feat.data,
        "feat_indices": feat.indices,
        "feat_indptr": feat.indptr,
        "n_feats": np.asarray(ident.nb_numfeats),
        "ptc": np.asarray(ident.nb_ptc),
        "pc": np.asarray(ident.nb_pc),
        "classes": np.asarray(ident.nb_classes, dtype=str),
    }


def _model_arrays() -> dict[str, np.ndarray]:
    """The unpacked model, from a cache file keyed by the model's hash (every process and Ray
    actor that filters languages would otherwise unpack it again); built and cached once."""
    from langid.langid import model

    digest = hashlib.sha256(model.encode() if isinstance(model, str) else model).hexdigest()
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kiln"
    )
    path = os.path.join(root, f"langid-{digest[:16]}.npz")
    with contextlib.suppress(OSError, ValueError, KeyError, EOFError), np.load(path) as cached:
        return {k: cached[k] for k in cached.files}
    arrays = _build_arrays(model)
    with contextlib.suppress(OSError):  # a read-only home: no cache, same model
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, path)  # atomic: concurrent actors never read a half-written file
    return arrays


@lru_cache(maxsize=4)
def batch_langid(max_bytes: int) -> BatchLangid:
    return BatchLangid(max_bytes)
