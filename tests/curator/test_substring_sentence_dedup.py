"""Substring and sentence dedup: planted repeats are cut at their exact character offsets,
nothing else changes, counts are conserved and memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.config import PROSE_RULES
from kiln.curator.dedup.config import SentenceDedupConfig, SubstringDedupConfig
from kiln.curator.dedup.sentence import dedup_sentences
from kiln.curator.dedup.substring import dedup_substrings

K = 8


def _words(rng: np.random.Generator, n: int) -> str:
    # a space of 10^9 words: no accidental repeat of K consecutive words
    return " ".join(f"w{x}" for x in rng.integers(0, 10**9, size=n))


def _planted_corpus():
    """Twelve random documents; one 20-word span planted in documents 2, 5 and 9 (first copy in
    document 2); returns the texts and each copy's (start, end) character offsets."""
    rng = np.random.default_rng(7)
    span = _words(rng, 20)
    texts, where = [], {}
    for d in range(12):
        head, tail = _words(rng, 30), _words(rng, 30)
        if d in (2, 5, 9):
            texts.append(f"{head} {span} {tail}")
            where[d] = (len(head) + 1, len(head) + 1 + len(span))
        else:
            texts.append(f"{head} {tail}")
    return texts, where


@pytest.mark.parametrize("memory_limit_mb", [64, 0.0001])  # one shard; one shard per document
def test_substring_cuts_later_copies_exactly(tmp_path, memory_limit_mb):
    texts, where = _planted_corpus()
    cfg = SubstringDedupConfig(
        enabled=True, min_span_tokens=K, min_doc_tokens=5, memory_limit_mb=memory_limit_mb
    )
    out, removals = dedup_substrings(texts, cfg, str(tmp_path))
    assert [r.ranges for r in removals] == [[where[d]] if d in (5, 9) else [] for d in range(12)]
    for d, text in enumerate(texts):
        a, b = where.get(d, (0, 0))
        assert out[d] == (text[:a] + text[b:] if d in (5, 9) else text)


def test_substring_remove_all_copies_and_drop_short(tmp_path):
    texts, where = _planted_corpus()
    rng = np.random.default_rng(3)
    short = f"{_words(rng, 2)} {texts[5][where[5][0] : where[5][1]]}"  # 2 words + the span
    cfg = SubstringDedupConfig(
        enabled=True, min_span_tokens=K, min_doc_tokens=5, mode="remove_all_copies"
    )
    out, removals = dedup_substrings([*texts, short], cfg, str(tmp_path))
    assert [r.ranges for r in removals[:12]] == [
        [where[d]] if d in where else [] for d in range(12)
    ]
    assert out[12] is None and removals[12].drop  # 2 tokens left < min_doc_tokens
    assert sum(o is not None for o in out) + sum(r.drop for r in removals) == 13


EN = "Cats sleep a lot. Dogs bark at night! Is the bird awake? "
JA = "今日は晴れです。明日は雨でしょう！本当ですか？"


@pytest.mark.parametrize("memory_limit_mb", [64, 0.0001])
def test_sentence_cuts_repeated_windows_english_and_japanese(tmp_path, memory_limit_mb):
    texts = [
        "Intro here. " + EN + "Unique end one.",
        "Other start. " + EN + "Unique end two.",
        "前文です。" + JA + "終わり。",
        "別の文。" + JA + "最後。",
        "Two sentences only. Cats sleep a lot. Dogs bark at night!",  # 2 of 3: not a window
        "Nothing repeated. At all here. Three sentences.",
    ]
    cfg = SentenceDedupConfig(enabled=True, min_doc_tokens=2, memory_limit_mb=memory_limit_mb)
    out, removals = dedup_sentences(texts, cfg, str(tmp_path))
    en_at, ja_at = len("Other start. "), len("別の文。")
    assert [r.ranges for r in removals] == [
        [],
        [(en_at, en_at + len(EN.rstrip()))],
        [],
        [(ja_at, ja_at + len(JA))],
        [],
        [],
    ]
    assert out[1] == "Other start.  Unique end two." and out[3] == "別の文。最後。"
    assert [out[i] for i in (0, 2, 4, 5)] == [texts[i] for i in (0, 2, 4, 5)]


def test_curate_counts_substring_and_sentence_dedup(tmp_path):
    texts, where = _planted_corpus()
    rng = np.random.default_rng(5)
    span = texts[5][where[5][0] : where[5][1]]
    texts.append(f"{_words(rng, 2)} {span}")  # left with 2 tokens: dropped by substring dedup
    # a window of 6 tokens (under K, so substring dedup leaves it): the 2nd is left too short
    texts += ["Intro here. Yes. No. Maybe. " + _words(rng, 30), "Yes. No. Maybe. x."]
    with open(tmp_path / "in.jsonl", "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"d{i:02d}", "text": text}, ensure_ascii=False) + "\n")
    filters = {**PROSE_RULES, "top_ngram_char_fraction": None}
    cfg = CurateConfig(
        input=[str(tmp_path / "in.jsonl")],
        filters=filters,
        dedup={
            "exact": False,
            "fuzzy": {"enabled": False},
            "substring": {"enabled": True, "min_span_tokens": K, "min_doc_tokens": 5},
            "sentence": {"enabled": True, "min_doc_tokens": 5},
        },
        output={"plot": False},
        stream="inline",
    )
    report = curate(cfg, str(tmp_path / "out"))
    steps = {s["step"]: s for s in report["steps"]}
    assert steps["substring_dedup"]["removed"] == 1
    assert steps["substring_dedup"]["documents_cut"] == 3  # documents 5, 9 and the short one
    assert steps["sentence_dedup"]["removed"] == 1
    assert steps["sentence_dedup"]["documents_cut"] == 1
    assert report["removed_by_reason"] == {"substring_dedup": 1, "sentence_dedup": 1}
    assert report["kept"] == len(texts) - 2 and report["invariant_holds"]
    import pyarrow.parquet as pq

    kept = pq.read_table(str(tmp_path / "out" / "shard-00000.parquet")).to_pydict()
    by_id = dict(zip(kept["id"], kept["text"], strict=True))
    a, b = where[5]
    assert by_id["d05"] == texts[5][:a] + texts[5][b:] and by_id["d02"] == texts[2]


MEMORY_SCRIPT = textwrap.dedent(
    """
    import os, sys, tracemalloc
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from kiln.curator.dedup.config import SentenceDedupConfig, SubstringDedupConfig
    from kiln.curator.dedup.sentence import find_sentence_removals
    from kiln.curator.dedup.substring import find_substring_removals, shards_of

    work, cap_mb = sys.argv[1], float(sys.argv[2])
    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i}" for i in range(50_000)])

    def corpus(folder, mb):
        os.makedirs(folder)
        files, chars = [], 0
        while chars < mb * 2**20:
            docs = [" ".join(rng.choice(vocab, 150)) + ". End." for _ in range(200)]
            files.append(os.path.join(folder, f"part-{len(files):04d}.parquet"))
            pq.write_table(pa.table({"text": docs}), files[-1])
            chars += sum(map(len, docs))
        return files, chars

    def rss_mb():
        with open("/proc/self/status") as f:
            return int(next(x for x in f if x.startswith("VmRSS")).split()[1]) / 1024

    def dedup(files, chars, on_shard):
        def shards():
            for path in files:
                yield from shards_of(pq.read_table(path).column("text").to_pylist(), cap_mb)

        sub = SubstringDedupConfig(enabled=True, memory_limit_mb=cap_mb)
        sen = SentenceDedupConfig(enabled=True, memory_limit_mb=cap_mb)
        n = 0
        for find, cfg in ((find_substring_removals, sub), (find_sentence_removals, sen)):
            for rem in find(shards, cfg, work, chars):
                n += len(rem)
                on_shard()
        return n

    small = corpus(os.path.join(work, "small"), 0.25)
    files, chars = corpus(os.path.join(work, "corpus"), float(sys.argv[3]))
    dedup(*small, lambda: None)  # lazy imports (Dask's scheduler) happen here, not traced
    base = rss_mb()
    tracemalloc.start()  # what the dedups allocate (Python objects and numpy arrays)
    rss = [0.0]
    n = dedup(files, chars, lambda: rss.append(rss_mb() - base))
    print(chars / 2**20, n // 2, tracemalloc.get_traced_memory()[1] / 2**20, max(rss))
    """
)


@pytest.mark.slow
def test_memory_stays_under_cap_on_a_larger_corpus(tmp_path):
    """Both dedups over a 3 MB corpus with a 0.75 MB cap (after a small warm-up run): the peak of
    what they allocate (tracemalloc: Python objects and numpy arrays, sampled by the tracer
    itself) stays under twice the cap: the shard's index plus one file read and the spill
    buffer. (~20 s on a busy 2-core machine: 3 MB of text through both dedups, twice each.)"""
    cap = 0.75
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path), str(cap), "3"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    corpus_mb, docs, peak_mb, rss_growth_mb = map(float, done.stdout.split())
    print(
        f"corpus {corpus_mb:.1f} MB, peak allocated {peak_mb:.2f} MB, RSS +{rss_growth_mb:.1f} MB"
    )
    assert corpus_mb >= 4 * cap and docs >= 3000
    assert peak_mb < 2 * cap, f"the dedups allocated {peak_mb:.2f} MB with a {cap} MB cap"
