"""The data loader's inner loop: copy document pieces out of the memory map into a batch.

A batch of 8 x 2049 tokens is ~50 pieces of shuffled documents scattered over the `.bin`. Done
from Python each piece costs a slice object, a view and a join (~0.3 µs), and the copy holds the
GIL. This kernel, compiled once by numba (and cached on disk), copies and widens all pieces in
one call without the GIL, so the prefetch thread runs beside the training step; per batch it is
then bound by the memory reads of the scattered pieces, as a plain copy would be.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def _kernel():
    import numba  # imported on first use: it takes ~0.5 s, and most kiln commands never copy

    @numba.njit(nogil=True, cache=True)
    def copy_pieces(tokens, starts, lengths, out):
        # First touch each piece: these loads are independent, so their cache and TLB misses
        # overlap instead of stalling the copy loop one piece at a time.
        wanted = touched = 0
        for i in range(starts.shape[0]):
            wanted += lengths[i]
            if 0 <= starts[i] < tokens.shape[0]:
                touched += tokens[starts[i]]  # returned, so the compiler keeps the load
        # Slices clamp to the arrays' bounds and the loop runs over the shorter one, so bad
        # offsets copy less (which the caller detects) instead of writing past `out`.
        k = 0
        for i in range(starts.shape[0]):
            src = tokens[max(starts[i], 0) : max(starts[i] + lengths[i], 0)]
            dst = out[k : k + src.shape[0]]
            for j in range(dst.shape[0]):  # a plain loop vectorises; slice assignment does not
                dst[j] = src[j]
            k += dst.shape[0]
        return k, wanted, touched

    return copy_pieces


def copy_pieces(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray):
    """out.flat[:] = tokens[starts[0]:+lengths[0]] ++ tokens[starts[1]:+lengths[1]] ++ ...

    `tokens` is the 1-D token array (a memory map), `starts`/`lengths` int64 token offsets and
    counts, `out` a C-contiguous array (of a wider integer type) with room for exactly the sum
    of the lengths."""
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    copied, wanted, _ = _kernel()(tokens, starts, lengths, out.reshape(-1))
    if copied != wanted or wanted != out.size:
        raise ValueError(
            f"document pieces hold {wanted} tokens ({copied} inside the token array),"
            f" out has room for {out.size}"
        )
