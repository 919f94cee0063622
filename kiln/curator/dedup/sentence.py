"""Sentence dedup (datatrove's SentenceDedup): every window of `window` consecutive sentences is
hashed; a window seen earlier in corpus order has its sentences cut from the later document.

Bounded memory: window hashes are spilled with their corpus position, partitioned by hash prefix
(hash_spill), and each partition is read alone on Dask to find the later copies.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from kiln.curator.dedup.config import SentenceDedupConfig
from kiln.curator.dedup.hash_spill import HashSpill, all_repeated_keys, partitions_for
from kiln.curator.dedup.substring import Removals, apply_removals, shards_of
from kiln.curator.dedup.tokens import token_spans, window_hashes

# a sentence: from a non-space character to . ! ? followed by a space or the end, or to a
# Japanese 。！？ (no space follows those), or to the end of the text
SENTENCE = re.compile(r"\S.*?(?:[.!?]+(?=\s|$)|[。！？]+|$)", re.S)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each sentence of `text`."""
    return [m.span() for m in SENTENCE.finditer(text)]


def _sentence_hashes(text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    return np.array(
        [
            int.from_bytes(hashlib.blake2b(text[a:b].encode(), digest_size=8).digest(), "little")
            for a, b in spans
        ],
        dtype=np.uint64,
    )


def _windows(text: str, w: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    spans = sentence_spans(text)
    return spans, window_hashes(_sentence_hashes(text, spans), w)


def find_sentence_removals(
    shards: Callable[[], Iterable[list[str]]],
    cfg: SentenceDedupConfig,
    work_dir: str,
    corpus_chars: int,
) -> Iterator[list[Removals]]:
    """Per shard of `shards()` (called twice, the same shards both times), each document's
    sentence ranges to cut. `corpus_chars` bounds the number of windows (sizes the partitions)."""
    spill_dir = os.path.join(work_dir, "sentence-spill")
    shutil.rmtree(spill_dir, ignore_errors=True)
    memory = int(cfg.memory_limit_mb * 2**20)
    # one window per sentence, taken as >= 8 characters; two partitions sorted at once on Dask
    spill = HashSpill(spill_dir, partitions_for(corpus_chars // 8, memory // 2), memory // 4)
    key = 0
    for texts in shards():
        hashes, keys = [], []
        for text in texts:
            _, wh = _windows(text, cfg.window)
            hashes.append(wh)
            keys.append(key + np.arange(len(wh), dtype=np.int64))
            key += len(wh)
        if hashes:
            spill.add(np.concatenate(hashes), np.concatenate(keys))
    later = all_repeated_keys(spill, keep_first=True)
    key = 0
    for texts in shards():
        out = []
        for text in texts:
            spans, wh = _windows(text, cfg.window)
            lo, hi = np.searchsorted(later, [key, key + len(wh)])
            cut = np.zeros(len(spans), dtype=bool)
            for start in later[lo:hi] - key:
                cut[start : start + cfg.window] = True
            key += len(wh)
            out.append(_removals(text, spans, cut, cfg.min_doc_tokens))
        yield out
    shutil.rmtree(spill_dir, ignore_errors=True)


def _removals(
    text: str, spans: list[tuple[int, int]], cut: np.ndarray, min_doc_tokens: int
) -> Removals:
    ranges: list[tuple[int, int]] = []
    for i in np.flatnonzero(cut):
        a, b = spans[i]
        if i > 0 and cut[i - 1]:
            ranges[-1] = (ranges[-1][0], b)  # consecutive cut sentences: one range
        else:
            ranges.append((a, b))
    if not ranges:
        return Removals([], drop=len(token_spans(text)[0]) < min_doc_tokens)
    left = apply_removals(text, Removals(ranges, False))
    return Removals(ranges, drop=len(token_spans(left)[0]) < min_doc_tokens)


def dedup_sentences(
    texts: list[str], cfg: SentenceDedupConfig, work_dir: str
) -> tuple[list[str | None], list[Removals]]:
    """The SDK's one call: each text with its repeated sentence windows cut (None when dropped
    as too short), and the removals made."""
    shards = shards_of(texts, cfg.memory_limit_mb)
    total = sum(len(t) for t in texts)
    removals = [r for s in find_sentence_removals(lambda: shards, cfg, work_dir, total) for r in s]
    out = [None if r.drop else apply_removals(t, r) for t, r in zip(texts, removals, strict=True)]
    return out, removals
