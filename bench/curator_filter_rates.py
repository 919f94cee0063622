"""Filter rejection counts per source on the real shared corpus (English Python docs, Japanese
man pages): each rule's rejections (a document may fail several) and the first failed rule (the
reason curate records), with the default `CurateConfig`.

  .venv/bin/python bench/curator_filter_rates.py [--corpus ../shared/corpora/corpus.jsonl] \
      [--japanese-words tokenizer]   # Japanese split by MeCab (the `ja` extra), not characters

Prints, per source, documents in / rejected / kept share, and the Japanese:English kept ratio.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import numpy as np

from kiln.curator.clean import Cleaner
from kiln.curator.config import CurateConfig
from kiln.curator.filters import DocBatch, build_filters
from kiln.curator.filters.japanese import JapaneseSegmenter

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")


def rates(texts: list[str], cfg: CurateConfig) -> tuple[int, Counter, Counter]:
    """(rejected, rejections per rule, first failed rule) over cleaned texts."""
    tokenizer = cfg.filters.japanese_words == "tokenizer"
    segmenter = JapaneseSegmenter() if tokenizer else None
    batch = DocBatch(
        Cleaner(cfg.clean)(texts), cfg.filters.no_space_script_ratio, segmenter=segmenter
    )
    each, first = Counter(), Counter()
    failed = np.zeros(len(texts), dtype=bool)
    for f in build_filters(cfg.filters):
        bad = ~np.asarray(f.keep(batch), dtype=bool)
        each[f.name] += int(bad.sum())
        first[f.name] += int((bad & ~failed).sum())
        failed |= bad
    return int(failed.sum()), each, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--japanese-words", choices=["characters", "tokenizer"], default="characters")
    args = ap.parse_args()
    cfg = CurateConfig(filters={"japanese_words": args.japanese_words})
    by_source: dict[str, list[str]] = {}
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            by_source.setdefault(doc["source"], []).append(doc["text"])
    kept_share = {}
    for source, texts in sorted(by_source.items()):
        rejected, each, first = rates(texts, cfg)
        kept_share[source] = 1 - rejected / len(texts)
        print(f"{source}: {len(texts)} docs, {rejected} rejected, kept {kept_share[source]:.1%}")
        print("  per rule:   ", {k: v for k, v in each.most_common() if v})
        print("  first rule: ", {k: v for k, v in first.most_common() if v})
    if {"manpages-ja", "python3.11-doc"} <= set(kept_share):
        ratio = kept_share["manpages-ja"] / kept_share["python3.11-doc"]
        print(f"kept share Japanese / English: {ratio:.2f}")


if __name__ == "__main__":
    main()
