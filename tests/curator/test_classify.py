"""Classifiers: fastText quality (English and Japanese) reaches >= 0.85 held-out accuracy on a
labelled mix; the classify stage conserves counts (reason `quality`), is deterministic for a seed
and gives the same output on `cluster: local` and `cluster: ray`; keep rules; the domain
classifier; the quality filter inside curate."""

from __future__ import annotations

import glob
import json
import os
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.curator.classify import ClassifyConfig, FastTextClassifier, classify
from kiln.curator.classify.config import FastTextConfig, KeepConfig
from kiln.curator.classify.keep import cutoff, keep_mask
from tests.curator.quality_docs import high_quality, quality_mix
from tests.platform.console_checks import assert_quiet

SMALL = {"dim": 16, "bucket": 20_000}  # a small model: quick on a busy 2-core machine


def _write(path, docs: list[dict]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return str(path)


def _accuracy(clf: FastTextClassifier, docs: list[dict], lang: str) -> float:
    docs = [d for d in docs if d["lang"] == lang]
    pred, _ = clf.predict([d["text"] for d in docs])
    return float(np.mean(pred == np.array([d["label"] for d in docs])))


def test_quality_classifier_separates_reference_from_junk_in_english_and_japanese():
    train = quality_mix(random.Random(0), 400)
    clf = FastTextClassifier.train(
        [d["text"] for d in train],
        [d["label"] for d in train],
        FastTextConfig(**SMALL),
        0.2,
        seed=0,
    )
    assert clf.meta["held_out_accuracy"] >= 0.85
    fresh = quality_mix(random.Random(1), 300)
    assert _accuracy(clf, fresh, "en") >= 0.85
    assert _accuracy(clf, fresh, "ja") >= 0.85


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("classify-in")
    rng = random.Random(2)
    good = [{"text": high_quality(rng, lang)} for lang in ("en", "ja") for _ in range(100)]
    corpus = quality_mix(random.Random(3), 240, good_share=0.3)
    os.makedirs(root / "corpus")
    for i in range(3):  # three files: three tasks for the actor pool
        _write(root / "corpus" / f"part{i}.jsonl", corpus[i::3])
    return root, _write(root / "good.jsonl", good), corpus


def _cfg(root, good, **over) -> ClassifyConfig:
    body = {
        "input": [str(root / "corpus")],
        "high_quality": [good],
        "sample_docs": 200,
        "seed": 5,
        "fasttext": SMALL,
    }
    return ClassifyConfig.model_validate(body | over)


def _tables(out: str) -> list[list[dict]]:
    files = sorted(glob.glob(os.path.join(out, "shard-*.parquet")))
    files += sorted(glob.glob(os.path.join(out, "rejected", "*.parquet")))
    return [pq.read_table(f).to_pylist() for f in files]


@pytest.fixture(scope="module")
def local_run(inputs, tmp_path_factory) -> tuple[str, dict]:
    """One `cluster: local` run: the determinism and the `cluster: ray` tests compare to it."""
    root, good, _ = inputs
    out = str(tmp_path_factory.mktemp("classify-out") / "local")
    return out, classify(_cfg(root, good), out)


def test_classify_conserves_counts_and_is_deterministic(inputs, local_run, tmp_path):
    root, good, corpus = inputs
    out_a, a = local_run
    b = classify(_cfg(root, good), str(tmp_path / "b"))
    assert a["documents_in"] == len(corpus) == a["kept"] + a["rejected"]
    assert a["invariant_holds"] and a["removed_by_reason"] == {"quality": a["rejected"]}
    assert sum(a["histogram"]["counts"]) == len(corpus)
    assert _tables(out_a) == _tables(str(tmp_path / "b"))
    assert a["model"]["held_out_accuracy"] == b["model"]["held_out_accuracy"]
    rows = [r for t in _tables(out_a) for r in t]
    assert {r["reason"] for r in rows if "reason" in r} == {"quality"}
    truth = {d["id"]: d["label"] for d in corpus}
    kept = [r for r in rows if "reason" not in r]
    # the corpus is 30% reference text: most of what is kept is reference text
    assert np.mean([truth[r["id"]] == "high" for r in kept]) >= 0.85
    assert all(r["quality_score"] >= 0.5 and r["quality_label"] == "high" for r in kept)


@pytest.mark.slow
def test_cluster_ray_equals_cluster_local(ray_session, inputs, local_run, tmp_path):
    root, good, _ = inputs
    out, local = local_run
    model = local["model"]["path"]  # the same model (training is tested above): scoring differs
    on_ray = classify(_cfg(root, good, cluster="ray", actors=2, model=model), str(tmp_path / "ray"))
    assert _tables(out) == _tables(str(tmp_path / "ray"))
    assert local["kept"] == on_ray["kept"]


def test_keep_rules():
    scores = np.linspace(0, 1, 101)
    ids = [f"d{i}" for i in range(101)]
    top = KeepConfig(method="top_percent", top_percent=10)
    assert keep_mask(scores, ids, top, cutoff(scores, top), 0).sum() == 11
    pareto = KeepConfig(method="pareto", alpha=3)
    a = keep_mask(scores, ids, pareto, 0, seed=1)
    assert (a == keep_mask(scores, ids, pareto, 0, seed=1)).all()
    assert a[scores > 0.9].mean() > a[scores < 0.1].mean()  # high scores are kept more often
    assert a[scores > 0.99].all() and 0 < a.sum() < 101


def test_domain_classifier_with_user_labels(inputs, tmp_path):
    root, _, _ = inputs
    rng = random.Random(4)
    labelled = [
        {"text": d["text"], "label": f"{d['lang']}-{d['label']}"} for d in quality_mix(rng, 300)
    ]
    cfg = ClassifyConfig(
        input=[str(root / "corpus")],
        kind="domain",
        labelled=_write(tmp_path / "labelled.jsonl", labelled),
        fasttext=SMALL,
        keep=KeepConfig(domains=["ja-high", "en-high"]),
    )
    report = classify(cfg, str(tmp_path / "out"))
    assert report["model"]["labels"] == ["en-high", "en-low", "ja-high", "ja-low"]
    assert report["model"]["held_out_accuracy"] >= 0.85
    kept = [r for t in _tables(str(tmp_path / "out"))[:3] for r in t if "reason" not in r]
    assert {r["domain_pred"] for r in kept} <= {"ja-high", "en-high"}
    assert all(0 < r["domain_prob"] <= 1 for r in kept)
    assert report["kept"] + report["removed_by_reason"]["domain"] == report["documents_in"]


def test_quality_filter_inside_curate(inputs, tmp_path):
    from kiln.curator import CurateConfig, curate

    root, good, corpus = inputs
    trained = classify(_cfg(root, good, keep={"method": "all"}), str(tmp_path / "scored"))
    cfg = CurateConfig.model_validate(
        {
            "input": [str(root / "corpus")],
            "stream": "inline",
            "filters": {
                **{k: None for k in ("min_words", "min_alpha_word_ratio", "max_non_alnum_ratio")},
                "min_terminal_punct_line_ratio": None,
                "languages": None,
                "quality_model": trained["model"]["path"],
            },
            "dedup": {"exact": False, "fuzzy": {"enabled": False}},
            "output": {"plot": False},
        }
    )
    report = curate(cfg, str(tmp_path / "curated"))
    assert report["invariant_holds"] and report["documents_in"] == len(corpus)
    assert report["removed_by_reason"].get("quality", 0) > 0


def test_stage_in_a_pipeline_and_the_cli(inputs, tmp_path, capfd):
    from kiln.curator.classify.stages import ClassifyStage
    from kiln.platform.cli import main
    from kiln.platform.pipeline import Pipeline

    root, good, corpus = inputs
    stage = ClassifyStage(_cfg(root, good).model_dump())
    result = Pipeline("cls", [stage], runs_dir=tmp_path / "runs").run(shutdown=False)
    art = result.artifact("classify.corpus")
    assert art.kind == "Corpus"
    assert art.counts["documents"] + art.counts["rejected"] == len(corpus)
    assert art.meta["held_out_accuracy"] >= 0.85
    model = os.path.join(art.path, "model")
    args = ["classify", "--input", str(root / "corpus"), "--output", str(tmp_path / "cli")]
    capfd.readouterr()
    assert main([*args, "--model", model]) == 0
    table = assert_quiet(*capfd.readouterr())  # one summary table, no JSON dump
    assert table["kept"] == f"{art.counts['documents']:,}"
    assert main([*args[:-1], str(tmp_path / "bad"), "--model", str(tmp_path)]) == 2
    assert "not a classifier folder" in capfd.readouterr().err
