"""Scoring the corpus file by file, in this process or in a Ray Data actor pool (one model per
actor, fractional CPUs); each scored file is written to Parquet with the new columns."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.classify.classifiers import Classifier, load_classifier
from kiln.curator.classify.data import read_table
from kiln.curator.classify.perplexity import PerplexityScorer

HIGH, LOW = "high", "low"
CHUNK = 10_000


def score_table(clf: Classifier, table: pa.Table, kind: str) -> pa.Table:
    """The table plus `quality_score`/`quality_label` or `domain_pred`/`domain_prob`."""
    texts = table.column("text").to_pylist()
    best, probs = [], []
    for i in range(0, len(texts), CHUNK):
        b, p = clf.predict(texts[i : i + CHUNK])
        best.append(b)
        probs.append(p)
    labels = np.concatenate(best) if best else np.array([], dtype=object)
    probs = np.concatenate(probs) if probs else np.zeros((0, len(clf.labels)))
    if kind == "quality":
        score = probs[:, clf.labels.index(HIGH)]
        return table.append_column("quality_score", pa.array(score, pa.float64())).append_column(
            "quality_label", pa.array(labels.tolist(), pa.string())
        )
    return table.append_column("domain_pred", pa.array(labels.tolist(), pa.string())).append_column(
        "domain_prob", pa.array(probs.max(axis=1) if len(probs) else [], pa.float64())
    )


def make_scorer(spec: dict):
    """table -> scored table, for `kind` quality / domain (fastText) or perplexity."""
    if spec["kind"] == "perplexity":
        p = spec["perplexity"]
        scorer = PerplexityScorer(p["model"], p["tokenizer"], p["max_tokens"], p["batch_size"])

        def score(table: pa.Table) -> pa.Table:
            ppl = scorer.perplexity(table.column("text").to_pylist())
            return table.append_column("perplexity", pa.array(ppl, pa.float64()))

        return score
    clf = load_classifier(spec["model_dir"])
    return lambda table: score_table(clf, table, spec["kind"])


def score_file(scorer, index: int, path: str, work_dir: str, text_field: str) -> dict:
    table = scorer(read_table(path, text_field))
    pq.write_table(table, os.path.join(work_dir, f"scored-{index:05d}.parquet"))
    return {"index": index, "docs": table.num_rows}


class ScoreActor:
    """A Ray Data actor: loads the classifier (or language model) once, scores whole files."""

    def __init__(self, spec: dict, work_dir: str, text_field: str):
        self.scorer = make_scorer(spec)
        self.args = (work_dir, text_field)

    def __call__(self, batch: dict) -> dict:
        out = [
            score_file(self.scorer, int(i), str(p), *self.args)
            for i, p in zip(batch["index"], batch["path"], strict=True)
        ]
        return {"index": [o["index"] for o in out], "docs": [o["docs"] for o in out]}


def score_files(
    files: list[str],
    spec: dict,
    work_dir: str,
    text_field: str,
    cluster: str,
    actors: int | None = None,
) -> list[str]:
    """Score every file; returns the scored parts in input order."""
    if cluster == "local":
        scorer = make_scorer(spec)
        for i, p in enumerate(files):
            score_file(scorer, i, p, work_dir, text_field)
    else:
        import ray

        size = max(1, min(len(files), actors or os.cpu_count() or 1))
        ds = ray.data.from_items(
            [{"index": i, "path": p} for i, p in enumerate(files)],
            override_num_blocks=max(1, len(files)),
        )
        ds.map_batches(
            ScoreActor,
            fn_constructor_args=(spec, work_dir, text_field),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=size),
            num_cpus=0.5,
        ).take_all()
    return [os.path.join(work_dir, f"scored-{i:05d}.parquet") for i in range(len(files))]
