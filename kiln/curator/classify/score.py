"""Scoring the corpus file by file, in this process or in a Ray Data actor pool (one model per
actor, fractional CPUs); each scored file is written to Parquet with the new columns."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.classify.data import read_table
from kiln.curator.classify.fasttext_model import FastTextClassifier

HIGH, LOW = "high", "low"
CHUNK = 10_000


def score_table(clf: FastTextClassifier, table: pa.Table, kind: str) -> pa.Table:
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


def score_file(
    clf: FastTextClassifier, index: int, path: str, work_dir: str, kind: str, text_field: str
) -> dict:
    table = score_table(clf, read_table(path, text_field), kind)
    pq.write_table(table, os.path.join(work_dir, f"scored-{index:05d}.parquet"))
    return {"index": index, "docs": table.num_rows}


class ScoreActor:
    """A Ray Data actor: loads the classifier once, scores whole files."""

    def __init__(self, model_dir: str, work_dir: str, kind: str, text_field: str):
        self.clf = FastTextClassifier.load(model_dir)
        self.args = (work_dir, kind, text_field)

    def __call__(self, batch: dict) -> dict:
        out = [
            score_file(self.clf, int(i), str(p), *self.args)
            for i, p in zip(batch["index"], batch["path"], strict=True)
        ]
        return {"index": [o["index"] for o in out], "docs": [o["docs"] for o in out]}


def score_files(
    files: list[str],
    model_dir: str,
    work_dir: str,
    kind: str,
    text_field: str,
    cluster: str,
    actors: int | None = None,
) -> list[str]:
    """Score every file; returns the scored parts in input order."""
    if cluster == "local":
        clf = FastTextClassifier.load(model_dir)
        for i, p in enumerate(files):
            score_file(clf, i, p, work_dir, kind, text_field)
    else:
        import ray

        size = max(1, min(len(files), actors or os.cpu_count() or 1))
        ds = ray.data.from_items(
            [{"index": i, "path": p} for i, p in enumerate(files)],
            override_num_blocks=max(1, len(files)),
        )
        ds.map_batches(
            ScoreActor,
            fn_constructor_args=(model_dir, work_dir, kind, text_field),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=size),
            num_cpus=0.5,
        ).take_all()
    return [os.path.join(work_dir, f"scored-{i:05d}.parquet") for i in range(len(files))]
