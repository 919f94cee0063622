"""Substring and sentence dedup benchmark: Kiln's `dedup_substrings` and `dedup_sentences` over
real text (../shared/corpora/corpus.jsonl: Python docs in English, man pages in Japanese),
`--copies` times over (each copy after the first has its documents' halves swapped, so the
repeats are spans inside documents, not whole documents). Prints documents/s, MB/s, what was
cut and the documents dropped. datatrove's SentenceDedup / substring tools need its own venv
(KILN_BENCHVENV, see bench/curator.py); without it the peer column says so.

  .venv/bin/python bench/curator_substring.py --copies 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from kiln.curator.dedup.config import SentenceDedupConfig, SubstringDedupConfig
from kiln.curator.dedup.sentence import dedup_sentences
from kiln.curator.dedup.substring import dedup_substrings

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
BENCHVENV = os.environ.get("KILN_BENCHVENV", "/tmp/benchvenv")


def load(copies: int, limit: int) -> list[str]:
    with open(CORPUS) as f:
        texts = [json.loads(line)["text"] for line in f][:limit]
    out = list(texts)
    for _ in range(copies - 1):
        out += [t[len(t) // 2 :] + "\n" + t[: len(t) // 2] for t in texts]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--limit", type=int, default=10**9, help="documents read from the corpus")
    ap.add_argument("--memory-limit-mb", type=float, default=1024)
    args = ap.parse_args()
    texts = load(args.copies, args.limit)
    mb = sum(len(t.encode()) for t in texts) / 2**20
    peer = "datatrove: venv present, not run" if os.path.exists(BENCHVENV) else "datatrove: n/a"
    print(f"{len(texts)} documents, {mb:.1f} MB ({args.copies} copies)")
    runs = [
        ("substring", dedup_substrings, SubstringDedupConfig(enabled=True)),
        ("sentence", dedup_sentences, SentenceDedupConfig(enabled=True)),
    ]
    for name, run, cfg in runs:
        cfg = cfg.model_copy(update={"memory_limit_mb": args.memory_limit_mb})
        with tempfile.TemporaryDirectory() as work:
            t = time.perf_counter()
            out, removals = run(texts, cfg, work)
            s = time.perf_counter() - t
        cut = sum(b - a for r in removals for a, b in r.ranges)
        dropped = sum(o is None for o in out)
        print(
            f"{name:9s} kiln {len(texts) / s:8.0f} docs/s {mb / s:6.2f} MB/s  "
            f"cut {cut / 2**20:.2f} MB from {sum(bool(r.ranges) for r in removals)} documents, "
            f"dropped {dropped}  | {peer} (ratio n/a)"
        )


if __name__ == "__main__":
    main()
