"""Character n-gram shingles as 64-bit hashes, for a whole batch at once.

Texts are laid end to end as UTF-32 code points; every window of `n` code points inside one
document gets a polynomial hash mod 2^64, computed for all windows at once from one prefix sum
(the base is odd, so it has an inverse mod 2^64: H(i) = (S[i+n] - S[i]) * B^(i+n-1) with
S[p] = sum_{q<p} c[q] * B^-q), finished with the splitmix64 mixer so every bit is usable. A
document shorter than `n` is one shingle: itself.
"""

from __future__ import annotations

import numpy as np

_BASE = np.uint64(0x100000001B3)
_BASE_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a bijection that spreads entropy over all 64 bits."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


_POW_CACHE: dict[str, np.ndarray] = {}


def _powers(base: np.uint64, size: int, name: str) -> np.ndarray:
    cached = _POW_CACHE.get(name)
    if cached is None or len(cached) < size:
        arr = np.full(max(size, 1 << 16), base, dtype=np.uint64)
        arr[0] = 1
        cached = _POW_CACHE[name] = np.cumprod(arr)  # wraps mod 2^64, as intended
    return cached[:size]


def _window_hashes(cps: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hash of every length-n window of cps (uint64, mod 2^64)."""
    total = len(cps)
    prefix = np.zeros(total + 1, dtype=np.uint64)
    np.cumsum((cps + np.uint64(1)) * _powers(_BASE_INV, total, "inv"), out=prefix[1:])
    h = prefix[n:] - prefix[: total - n + 1]
    h *= _powers(_BASE, total, "pow")[n - 1 :]
    return h


def shingle_hashes(texts: list[str], n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(hashes uint64, doc index per hash), documents in order, each with at least one shingle."""
    lens = np.fromiter(map(len, texts), np.int64, len(texts))
    cps = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    total = len(cps)
    m = total - n + 1
    h = _window_hashes(cps, n) if m > 0 else np.zeros(0, dtype=np.uint64)
    n_windows = np.maximum(lens - n + 1, 0)
    doc = np.repeat(np.arange(len(texts)), n_windows)
    pos = np.arange(len(doc)) - np.repeat(np.cumsum(n_windows) - n_windows, n_windows) + starts[doc]
    hashes = h[pos] if len(pos) else np.zeros(0, dtype=np.uint64)
    short = np.nonzero(n_windows == 0)[0]
    if len(short):  # whole-document shingles for texts shorter than n
        extra = np.zeros(len(short), dtype=np.uint64)
        for k, d in enumerate(short):
            v = np.uint64(0)
            with np.errstate(over="ignore"):
                for c in cps[starts[d] : starts[d] + lens[d]]:
                    v = v * _BASE + c + np.uint64(1)
            extra[k] = v
        hashes = np.concatenate([hashes, extra])
        doc = np.concatenate([doc, short])
        order = np.argsort(doc, kind="stable")
        hashes, doc = hashes[order], doc[order]
    return mix64(hashes ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF)), doc


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique hash arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
