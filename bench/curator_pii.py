"""PII benchmark: Kiln's recognisers over real text (../shared/corpora/corpus.jsonl, Python docs in
English and man pages in Japanese), `--copies` times over, with one planted item of each type in
every tenth document. Prints documents/s and MB/s of `PiiScanner.scan` in batches of 2000 (the
curator's `read.chunk_docs`), the recall on the planted items and what it finds in the real text.
Presidio (`presidio-analyzer`, its pattern recognisers under a blank spaCy pipeline) is the peer
when installed in KILN_PRESIDIO_VENV (default /tmp/presidiovenv), timed on the first --peer-docs
documents: its figure and the ratio are printed beside Kiln's; without it, Kiln's row alone.

  python -m venv /tmp/presidiovenv && /tmp/presidiovenv/bin/pip install presidio-analyzer
  .venv/bin/python bench/curator_pii.py --copies 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import time

from kiln.curator.config import PiiConfig
from kiln.curator.pii import PiiScanner

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
PRESIDIO_VENV = os.environ.get("KILN_PRESIDIO_VENV", "/tmp/presidiovenv")
PLANTS = {
    "email": "taro_yamada@mail.example.co.jp",
    "phone": "090-1234-5678",
    "ip": "192.168.10.4",
    "credit_card": "4111 1111 1111 1111",
    "iban": "GB82 WEST 1234 5698 7654 32",
    "my_number": "1234 5678 9018",
    "postcode": "〒100-0001",
    "secret": "AKIAIOSFODNN7EXAMPLE",
}
PRESIDIO_SCRIPT = """
import json, sys, time
import spacy
from presidio_analyzer import AnalyzerEngine
from presidio_analyzer.nlp_engine import SpacyNlpEngine
# Presidio's pattern recognisers (e-mail, phone, card, IBAN, IP, ...) under a blank spaCy
# pipeline: its NER model (en_core_web_lg) is a download, and Kiln's recognisers use no NER
spacy.blank("en").to_disk(sys.argv[2])
nlp = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": sys.argv[2]}])
engine = AnalyzerEngine(nlp_engine=nlp, supported_languages=["en"])
texts = [json.loads(line) for line in open(sys.argv[1])]
engine.analyze(text=texts[0], language="en")
t = time.perf_counter()
found = sum(len(engine.analyze(text=x, language="en")) for x in texts)
print(json.dumps({"seconds": time.perf_counter() - t, "found": found}))
"""


def load(copies: int, seed: int) -> tuple[list[str], int]:
    with open(CORPUS) as f:
        base = [json.loads(line)["text"] for line in f]
    rng = random.Random(seed)
    texts, planted = [], 0
    for _ in range(copies):
        for text in base:
            if rng.random() < 0.1:
                lines = text.split("\n")
                for value in PLANTS.values():
                    lines.insert(rng.randrange(len(lines) + 1), f"連絡先: {value} まで。")
                text, planted = "\n".join(lines), planted + len(PLANTS)
            texts.append(text)
    return texts, planted


def run_kiln(texts: list[str], batch: int) -> tuple[float, dict]:
    scanner = PiiScanner(PiiConfig(enabled=True))
    items: dict[str, int] = {}
    t = time.perf_counter()
    for i in range(0, len(texts), batch):
        _, _, counts = scanner.scan(texts[i : i + batch])
        for k, n in counts.items.items():
            items[k] = items.get(k, 0) + n
    return time.perf_counter() - t, items


def run_presidio(texts: list[str]) -> dict | None:
    python = os.path.join(PRESIDIO_VENV, "bin", "python")
    if not os.path.exists(python):
        return None
    path = os.path.join(PRESIDIO_VENV, "texts.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(t, ensure_ascii=False) + "\n" for t in texts)
    blank = os.path.join(PRESIDIO_VENV, "blank_en")
    out = subprocess.run(
        [python, "-c", PRESIDIO_SCRIPT, path, blank], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-docs", type=int, default=1000, help="Presidio scans this prefix")
    args = ap.parse_args()
    texts, planted = load(args.copies, args.seed)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    seconds, items = run_kiln(texts, args.batch)
    n_plants = planted // len(PLANTS)
    print(f"corpus: {len(texts):,} docs, {mb:.1f} MB, {planted:,} planted items")
    print(f"found per type: {items} ({n_plants:,} planted of each)")
    kiln_rate = len(texts) / seconds
    print(f"kiln recognisers: {kiln_rate:,.0f} docs/s, {mb / seconds:.1f} MB/s ({seconds:.2f} s)")
    prefix = texts[: args.peer_docs]
    peer = run_presidio(prefix)
    if peer is None:
        print(f"presidio: not installed in {PRESIDIO_VENV} (KILN_PRESIDIO_VENV); no ratio")
        return
    peer_rate = len(prefix) / peer["seconds"]
    same = len(prefix) / min(run_kiln(prefix, args.batch)[0] for _ in range(3))
    print(f"kiln recognisers on the same {len(prefix):,} docs: {same:,.0f} docs/s")
    print(
        f"presidio AnalyzerEngine (pattern recognisers, first {len(prefix):,} docs): "
        f"{peer_rate:,.0f} docs/s ({peer['found']:,} items)"
    )
    print(f"ratio kiln / presidio (same docs): {same / peer_rate:.1f}x")


if __name__ == "__main__":
    main()
