"""Tokens for substring dedup, with their character offsets: a run of letters or digits of a
spaced script is one token; each CJK character and each other non-space character is one."""

from __future__ import annotations

import hashlib
import re

import numpy as np

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
TOKEN = re.compile(rf"[^\W{_CJK}]+|\S")


def token_spans(text: str) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and their (start, end) character offsets, shape (n, 2)."""
    matches = list(TOKEN.finditer(text))
    spans = np.array([m.span() for m in matches], dtype=np.int64).reshape(-1, 2)
    return [m.group() for m in matches], spans


class TokenHasher:
    """64-bit BLAKE2b of each distinct token (stable across processes, cached per shard)."""

    def __init__(self):
        self.cache: dict[str, int] = {}

    def __call__(self, tokens: list[str]) -> np.ndarray:
        cache = self.cache
        out = np.empty(len(tokens), dtype=np.uint64)
        for i, tok in enumerate(tokens):
            h = cache.get(tok)
            if h is None:
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
                cache[tok] = h
            out[i] = h
        return out


def window_hashes(token_hashes: np.ndarray, k: int) -> np.ndarray:
    """Hash of every window of `k` consecutive tokens: sum of token hash x a fixed odd multiplier
    per offset (mod 2^64), so order matters; len(token_hashes) - k + 1 values."""
    n = len(token_hashes) - k + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    mult = np.random.default_rng(0x5EED).integers(1, 2**63, size=k, dtype=np.uint64) * 2 + 1
    acc = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            acc += token_hashes[j : j + n] * mult[j]
    return acc
