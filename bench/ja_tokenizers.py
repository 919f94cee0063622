"""Japanese tokenizers on ~1 MB of real man pages (../shared/corpora/corpus.jsonl, lang ja):
fugashi + unidic-lite (Kiln's `ja` extra) against SudachiPy + sudachidict-core (split mode A,
surface only), each timed twice, the best kept. SudachiPy is no Kiln dependency: run this with a
Python that has both, e.g.

  python -m venv /tmp/javenv && /tmp/javenv/bin/pip install fugashi unidic-lite sudachipy \\
      sudachidict-core && /tmp/javenv/bin/python bench/ja_tokenizers.py
"""

from __future__ import annotations

import json
import os
import time

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
CHUNK = 20_000  # SudachiPy refuses inputs over 49,149 bytes


def japanese_text(limit: int = 1_000_000) -> list[str]:
    out, size = [], 0
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if doc.get("lang") == "ja" and size < limit:
                out.append(doc["text"])
                size += len(doc["text"].encode())
    return out


def best(fn, texts: list[str]) -> tuple[float, int]:
    runs = []
    for _ in range(2):
        t = time.perf_counter()
        n = sum(fn(x) for x in texts)
        runs.append(time.perf_counter() - t)
    return min(runs), n


def main() -> None:
    import fugashi
    from sudachipy import Dictionary, SplitMode

    texts = japanese_text()
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tagger = fugashi.Tagger()
    sudachi = Dictionary(dict="core").tokenizer(SplitMode.A, fields={"surface"})

    def sudachi_count(text: str) -> int:
        return sum(len(sudachi.tokenize(text[i : i + CHUNK])) for i in range(0, len(text), CHUNK))

    fug_s, fug_n = best(lambda x: len(tagger(x)), texts)
    sud_s, sud_n = best(sudachi_count, texts)
    print(f"{len(texts)} docs, {mb:.2f} MB of Japanese man pages")
    print(f"fugashi + unidic-lite: {mb / fug_s:.2f} MB/s ({fug_n:,} tokens)")
    print(f"SudachiPy core, mode A: {mb / sud_s:.2f} MB/s ({sud_n:,} tokens)")
    print(f"ratio fugashi / SudachiPy: {sud_s / fug_s:.2f}x")


if __name__ == "__main__":
    main()
