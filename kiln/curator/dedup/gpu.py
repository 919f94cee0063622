"""GPU MinHash with cuDF (`Series.str.minhash`, the kernel NeMo Curator uses). Same interface as
`MinHasher`; used when `backend: cudf`. Band keys are then computed exactly as on CPU."""

from __future__ import annotations

import numpy as np

from kiln.curator.dedup.minhash import MinHasher


class CudfMinHasher(MinHasher):
    """k-permutation MinHash of character n-grams on the GPU (cuDF >= 24.12: seed, a, b, width)."""

    def signatures(self, texts: list[str]) -> np.ndarray:
        import cudf

        if not texts:
            return np.zeros((0, self.k), dtype=np.uint32)
        series = cudf.Series(texts)
        a = cudf.Series((self.a >> np.uint64(32)).astype(np.uint32))
        b = cudf.Series((self.b >> np.uint64(32)).astype(np.uint32))
        sig = series.str.minhash(self.seed, a, b, self.ngram)
        return np.asarray(sig.list.leaves.to_numpy(), dtype=np.uint32).reshape(len(texts), self.k)
