"""Decontamination: every document sharing a >= 13-token sequence with the eval set is dropped
(word tokens, CJK by character, case and punctuation ignored) and nothing else; counts conserved
through curate with the reason `decontaminated`."""

from __future__ import annotations

import json
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.filters.decontam import Decontaminate
from tests.curator.prose import JA_SENTENCES, japanese, prose, sentence

N = 13
_TOKEN = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]|[^\W_\u3040-\u30ff\u4e00-\u9fff]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _grams(text: str, n: int = N) -> set[tuple[str, ...]]:
    t = _tokens(text)
    return {tuple(t[i : i + n]) for i in range(len(t) - n + 1)}


def _span(rng: random.Random, text: str, n: int, lang: str) -> str:
    """n consecutive tokens of text, re-spelled (case, punctuation) the way a web page might."""
    t = _tokens(text)
    i = rng.randrange(len(t) - n + 1)
    if lang == "ja":
        return "".join(t[i : i + n])
    return ", ".join(" ".join(t[i : i + n]).upper().split(" ", 1))


def _eval_set(rng: random.Random) -> list[str]:
    en = [" ".join(sentence(rng) for _ in range(3)) for _ in range(20)]
    ja = ["".join(rng.sample(JA_SENTENCES, 2)) for _ in range(10)]
    return en + ja


def _mix(rng: random.Random, items: list[str]) -> tuple[dict[str, str], set[str], dict[str, int]]:
    """Clean docs, docs with an eval 13..20-gram planted, docs with only a 12-gram planted:
    (texts, the ids sharing a 13-gram by brute force, what was planted: 0, 1 or 2)."""
    docs, kinds = {}, {}
    for i in range(90):
        lang = "ja" if i % 3 == 0 else "en"
        base = japanese(rng) if lang == "ja" else prose(rng)
        kind = i % 9 // 3  # 0 clean, 1 a 13..20-gram, 2 a 12-gram
        if kind:
            pool = [t for t in items if (lang == "ja") == bool(re.search("[ぁ-ん]", t))]
            n = rng.randint(N, N + 7) if kind == 1 else N - 1
            cut = base.index("\n") if "\n" in base else len(base)
            base = base[:cut] + " " + _span(rng, rng.choice(pool), n, lang) + " " + base[cut:]
        docs[f"{lang}{i}"], kinds[f"{lang}{i}"] = base, kind
    ref = set().union(*(_grams(t) for t in items))
    dirty = {k for k, t in docs.items() if _grams(t) & ref}
    return docs, dirty, kinds


def test_removes_every_document_sharing_a_13_gram_and_nothing_else():
    rng = random.Random(0)
    items = _eval_set(rng)
    docs, dirty, kinds = _mix(rng, items)
    # every planted 13-gram is found by brute force; most planted 12-grams are not contamination
    assert {k for k, kind in kinds.items() if kind == 1} <= dirty
    assert sum(kind == 2 and k not in dirty for k, kind in kinds.items()) >= 20
    f = Decontaminate(items, ngram=N, min_ngram=N)
    hit = f.contaminated(pa.array(list(docs.values()), pa.large_string()))
    assert {k for k, h in zip(docs, hit, strict=True) if h} == dirty


def test_short_eval_items_match_whole():
    f = Decontaminate(["What is the capital city of France today?"], ngram=13, min_ngram=8)
    hit = f.contaminated(pa.array(["Q: what is the CAPITAL city of France, today? A:", "Paris"]))
    assert hit.tolist() == [True, False]


@pytest.fixture
def files(tmp_path):
    rng = random.Random(1)
    items = _eval_set(rng)
    docs, _, _ = _mix(rng, items)
    with open(tmp_path / "eval.jsonl", "w") as f:
        for t in items:  # an eval item as question + answer fields
            q, _, a = t.partition(". ")
            f.write(json.dumps({"question": q, "answer": a}, ensure_ascii=False) + "\n")
    with open(tmp_path / "in.jsonl", "w") as f:
        for k, t in docs.items():
            f.write(json.dumps({"id": k, "text": t}, ensure_ascii=False) + "\n")
    return tmp_path, docs, items


def test_curate_drops_them_with_reason_decontaminated(files):
    root, docs, items = files
    ref = set().union(*(_grams(t) for t in _split_fields(items)))
    dirty = {k for k, t in docs.items() if _grams(t) & ref}
    cfg = CurateConfig.model_validate(
        {
            "input": [str(root / "in.jsonl")],
            "stream": "inline",
            "filters": {
                "decontaminate": [str(root / "eval.jsonl")],
                "decontaminate_min_ngram": N,  # the brute-force reference knows 13-grams only
            },
            "dedup": {"fuzzy": {"enabled": False}},
            "output": {"plot": False},
        }
    )
    report = curate(cfg, str(root / "out"))
    assert report["documents_in"] == len(docs) == report["kept"] + report["rejected"]
    assert report["invariant_holds"]
    rejected = pq.read_table(root / "out" / "rejected").to_pylist()
    assert {r["id"] for r in rejected if r["reason"] == "decontaminated"} == dirty
    assert report["removed_by_reason"]["decontaminated"] == len(dirty) > 0


def _split_fields(items: list[str]) -> list[str]:
    out = []
    for t in items:
        q, _, a = t.partition(". ")
        out += [q, a]
    return out
