"""The learned classifier (MiniLM sentence embeddings + logistic regression) against fastText on
the real corpus (../shared/corpora/corpus.jsonl: 593 Python doc pages in English, 914 Japanese man
pages): held-out accuracy on the same seeded split, and scoring docs/s over the whole corpus.

Label rule (a domain classifier, two classes, both languages): `reference` when the document
documents a command or an API (pydoc `library/` and `c-api/`, man sections 1 and 8), `other`
otherwise (tutorials, HOWTOs, what's new, language reference; man sections 4-7: devices, file
formats, games, overviews).

  .venv/bin/python bench/curator_classify.py [--max-tokens 256] [--threads 1]

Both run in this process; fastText scores on one thread, torch gets `--threads`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch

from kiln.curator.classify import ClassifyConfig, classify

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "corpus.jsonl")
REFERENCE = ("pydoc:library/", "pydoc:c-api/", "manja:man1/", "manja:man8/")


def label(doc_id: str) -> str:
    return "reference" if doc_id.startswith(REFERENCE) else "other"


def write_inputs(corpus: str, work: str) -> tuple[str, str, dict[str, int]]:
    """(labelled JSONL, corpus JSONL, label counts)."""
    with open(corpus, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    labelled, plain = os.path.join(work, "labelled.jsonl"), os.path.join(work, "corpus.jsonl")
    counts: dict[str, int] = {}
    with open(labelled, "w", encoding="utf-8") as a, open(plain, "w", encoding="utf-8") as b:
        for d in docs:
            lab = label(d["id"])
            counts[lab] = counts.get(lab, 0) + 1
            row = {"id": d["id"], "text": d["text"]}
            a.write(json.dumps(row | {"label": lab}, ensure_ascii=False) + "\n")
            b.write(json.dumps(row, ensure_ascii=False) + "\n")
    return labelled, plain, counts


def run(name: str, extra: dict, labelled: str, plain: str, work: str) -> dict:
    """Train on the labelled split, then score the whole corpus with the saved model."""
    base = {"kind": "domain", "labelled": labelled, "held_out": 0.2, "seed": 0}
    base["keep"] = {"method": "all"}
    trained = classify(
        ClassifyConfig.model_validate(base | {"input": [plain]} | extra),
        os.path.join(work, f"{name}-train"),
    )
    scored = classify(
        ClassifyConfig.model_validate(base | {"input": [plain], "model": trained["model"]["path"]}),
        os.path.join(work, f"{name}-score"),
    )
    return {
        "accuracy": trained["model"]["held_out_accuracy"],
        "held_out": trained["model"]["held_out_docs"],
        "train_s": trained["seconds"]["train"],
        "docs": scored["documents_in"],
        "score_s": scored["seconds"]["score"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens of each doc embedded")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the encoder")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-classify-") as work:
        labelled, plain, counts = write_inputs(args.corpus, work)
        print(f"labels: {counts} (rule: commands and APIs are `reference`)")
        fast = run("fasttext", {}, labelled, plain, work)
        emb = {"classifier": "embedding", "embedding": {"max_tokens": args.max_tokens}}
        learned = run("embedding", emb, labelled, plain, work)
    rows = [("fastText (1 thread)", fast), (f"MiniLM-{args.max_tokens} + LR", learned)]
    print(f"\n{'classifier':24} {'held-out acc':>12} {'train s':>8} {'docs':>6} {'docs/s':>9}")
    for name, r in rows:
        rate = r["docs"] / r["score_s"]
        print(f"{name:24} {r['accuracy']:>12.3f} {r['train_s']:>8.1f} {r['docs']:>6} {rate:>9.1f}")
    ratio = (learned["docs"] / learned["score_s"]) / (fast["docs"] / fast["score_s"])
    print(
        f"\nlearned / fastText docs/s: {ratio:.4f} ({1 / ratio:.0f}x slower); held-out accuracy "
        f"{learned['accuracy']:.3f} vs {fast['accuracy']:.3f} on the same {fast['held_out']} docs"
    )


if __name__ == "__main__":
    main()
