"""Exact-substring dedup (Lee et al. 2022, datatrove's method): spans of >= k tokens that occur
more than once in the corpus are cut out of every copy but the first (or out of all copies).

Bounded memory: documents are taken in shards whose tokens fit `memory_limit_mb`; inside a shard
a suffix array (pydivsufsort) and its LCP array find every repeated k-token window exactly.
Across shards, each window a shard keeps (its first copy, or a window seen once) is spilled as
a 64-bit hash with its corpus position, partitioned by hash prefix; each partition alone gives
the windows that occurred earlier in another shard. So the result is the same as one suffix array
over the whole corpus, up to 64-bit hash collisions across shards.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pydivsufsort

from kiln.curator.dedup.config import SubstringDedupConfig
from kiln.curator.dedup.hash_spill import HashSpill, all_repeated_keys, partitions_for
from kiln.curator.dedup.tokens import TokenHasher, token_spans, window_hashes

# bytes per token while a shard is indexed: ids, hashes, suffix array, LCP, spans, spill buffers
BYTES_PER_TOKEN = 96


@dataclass
class Removals:
    """One document's character ranges to cut, and whether what is left is too short to keep."""

    ranges: list[tuple[int, int]]
    drop: bool


def _suffix_array(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sa = pydivsufsort.divsufsort(ids)
    return sa.astype(np.int64), pydivsufsort.kasai(ids, sa).astype(np.int64)


def repeated_windows(ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, later) start positions of every k-token window that occurs more than once in
    `ids`: `first` the smallest position of each distinct window, `later` all the others."""
    if len(ids) < k + 1:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    sa, lcp = _suffix_array(ids)
    # lcp[i] is the common prefix of sa[i] and sa[i + 1]: a run of lcp >= k is one window's copies
    linked = lcp[:-1] >= k
    starts_group = np.ones(len(sa), dtype=bool)
    starts_group[1:] = ~linked
    group = np.cumsum(starts_group) - 1
    size = np.bincount(group)
    member = size[group] >= 2
    if not member.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pos, grp = sa[member], group[member]
    first_of = np.full(len(size), np.iinfo(np.int64).max)
    np.minimum.at(first_of, grp, pos)
    is_first = pos == first_of[grp]
    return np.sort(pos[is_first]), np.sort(pos[~is_first])


@dataclass
class _Shard:
    offset: int  # corpus position of its first token
    length: int  # tokens plus one separator per document


def _index_shard(texts: list[str], cfg: SubstringDedupConfig, offset: int, spill: HashSpill):
    """Suffix-array one shard; spill the windows it keeps; return its in-shard copies (corpus
    positions) and its length."""
    k = cfg.min_span_tokens
    vocab: dict[str, int] = {}
    hasher = TokenHasher()
    pieces, hash_pieces, starts = [], [], []
    pos = 0
    for text in texts:
        tokens, _ = token_spans(text)
        starts.append(pos)
        pieces.append(np.array([vocab.setdefault(t, len(vocab)) for t in tokens], np.int64))
        hash_pieces.append(hasher(tokens))
        pos += len(tokens) + 1
    # one separator id per document, never equal to a token or another separator
    seps = len(vocab) + np.arange(len(texts), dtype=np.int64)
    ids = np.empty(pos, dtype=np.int64)
    for d, (piece, start) in enumerate(zip(pieces, starts, strict=True)):
        ids[start : start + len(piece)] = piece
        ids[start + len(piece)] = seps[d]
    first, later = repeated_windows(ids.astype(np.int32) if pos < 2**31 else ids, k)
    keep_first = cfg.mode == "keep_first"
    copies = later if keep_first else np.union1d(first, later)
    skip = np.zeros(pos, dtype=bool)
    skip[later] = True  # a later copy is already cut; its first copy speaks for it across shards
    for start, hashes in zip(starts, hash_pieces, strict=True):
        wh = window_hashes(hashes, k)
        keys = start + np.arange(len(wh), dtype=np.int64)
        keep = ~skip[keys]
        spill.add(wh[keep], keys[keep] + offset)
    return copies + offset, pos


def _cut_ranges(texts: list[str], covered: np.ndarray, min_doc_tokens: int) -> list[Removals]:
    out, pos = [], 0
    for text in texts:
        _, spans = token_spans(text)
        n = len(spans)
        cov = covered[pos : pos + n]
        pos += n + 1
        ranges: list[tuple[int, int]] = []
        if cov.any():
            edges = np.diff(np.concatenate([[0], cov.astype(np.int8), [0]]))
            for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
                ranges.append((int(spans[a, 0]), int(spans[b - 1, 1])))
        out.append(Removals(ranges, drop=n - int(cov.sum()) < min_doc_tokens))
    return out


def find_substring_removals(
    shards: Callable[[], Iterable[list[str]]],
    cfg: SubstringDedupConfig,
    work_dir: str,
    corpus_chars: int,
) -> Iterator[list[Removals]]:
    """Per shard of `shards()` (called twice: the same shards both times), each document's
    ranges to cut. `corpus_chars` (an upper bound of the corpus' tokens) sizes the spill's
    partitions. Spill files live under `work_dir` and are removed at the end."""
    k = cfg.min_span_tokens
    spill_dir = os.path.join(work_dir, "substring-spill")
    shutil.rmtree(spill_dir, ignore_errors=True)
    memory = int(cfg.memory_limit_mb * 2**20)
    layout: list[_Shard] = []
    copies: list[np.ndarray] = []
    offset = 0
    # ~one window per token, ~4 characters a token in spaced scripts (CJK text, one character
    # a token, makes partitions up to 4x larger); two partitions are sorted at once on Dask
    spill = HashSpill(
        os.path.join(spill_dir, "hashes"),
        partitions_for(corpus_chars // 4, memory // 2),
        memory // 4,
    )
    for texts in shards():
        shard_copies, length = _index_shard(texts, cfg, offset, spill)
        path = os.path.join(spill_dir, f"copies-{len(layout):05d}.npy")
        np.save(path, shard_copies)
        copies.append(path)
        layout.append(_Shard(offset, length))
        offset += length
    cross = (
        all_repeated_keys(spill, cfg.mode == "keep_first")
        if len(layout) > 1
        else np.zeros(0, np.int64)
    )
    for i, texts in enumerate(shards()):
        sh = layout[i]
        starts = np.load(copies[i]) - sh.offset
        lo, hi = np.searchsorted(cross, [sh.offset, sh.offset + sh.length])
        starts = np.concatenate([starts, cross[lo:hi] - sh.offset])
        diff = np.zeros(sh.length + k + 1, dtype=np.int32)
        np.add.at(diff, starts, 1)
        np.add.at(diff, starts + k, -1)
        covered = np.cumsum(diff)[: sh.length] > 0
        yield _cut_ranges(texts, covered, cfg.min_doc_tokens)
    shutil.rmtree(spill_dir, ignore_errors=True)


def apply_removals(text: str, removals: Removals) -> str:
    """`text` without its cut ranges (the characters between them kept as they are)."""
    out, at = [], 0
    for a, b in removals.ranges:
        out.append(text[at:a])
        at = b
    out.append(text[at:])
    return "".join(out)


def shards_of(texts: list[str], memory_limit_mb: float) -> list[list[str]]:
    """`texts` in consecutive shards whose tokens fit the memory limit (tokens <= characters)."""
    budget = max(1, int(memory_limit_mb * 2**20) // BYTES_PER_TOKEN)
    shards, current, size = [], [], 0
    for t in texts:
        if current and size + len(t) > budget:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += len(t)
    if current:
        shards.append(current)
    return shards


def dedup_substrings(
    texts: list[str], cfg: SubstringDedupConfig, work_dir: str
) -> tuple[list[str | None], list[Removals]]:
    """The SDK's one call: each text with its repeated spans cut (None when dropped as too
    short), and the removals made."""
    shards = shards_of(texts, cfg.memory_limit_mb)
    total = sum(len(t) for t in texts)
    removals = [
        r for shard in find_substring_removals(lambda: shards, cfg, work_dir, total) for r in shard
    ]
    out = [None if r.drop else apply_removals(t, r) for t, r in zip(texts, removals, strict=True)]
    return out, removals
