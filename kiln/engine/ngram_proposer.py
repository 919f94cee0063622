"""Prompt-lookup drafting (vLLM's `ngram` method): no extra model. The last n tokens of a
sequence (prompt and output so far) are looked up earlier in the same sequence; the tokens that
followed that earlier occurrence are the draft. Code edits, extraction and summaries copy long
runs of their prompt, so the draft is often right and costs no forward at all."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Suffixes of `max_n` down to `min_n` tokens are tried, longest first; the most recent
    earlier occurrence wins (recent text predicts the next tokens best)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the longest matching earlier suffix; [] when none."""
        ids = np.asarray(token_ids, dtype=np.int64)
        size = ids.size
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            suffix = ids[size - n :]
            # windows that end before the last token: each is followed by at least one token,
            # and the suffix itself is never its own match
            windows = sliding_window_view(ids[: size - 1], n)
            starts = np.flatnonzero((windows == suffix).all(axis=1))
            if starts.size:
                follow = int(starts[-1]) + n
                return ids[follow : follow + k].tolist()
        return []
