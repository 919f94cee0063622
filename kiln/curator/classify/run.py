"""`classify()`: train (or load) a fastText classifier, score the corpus, keep by the configured
rule, write shards + `rejected/` + `report.json` (with the score histogram) + `model/`."""

from __future__ import annotations

import glob
import logging
import os
import random
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.classify.classifiers import Classifier, load_classifier, train_classifier
from kiln.curator.classify.config import ClassifyConfig
from kiln.curator.classify.data import expand, read_labelled, read_table, read_texts
from kiln.curator.classify.keep import cutoff, histogram, keep_mask
from kiln.curator.classify.perplexity import BUCKETS, bucket_cutoffs, buckets
from kiln.curator.classify.score import HIGH, LOW, score_files
from kiln.curator.report import write_report
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.runtime import Runtime

log = logging.getLogger("kiln.curator.classify")


def corpus_sample(files: list[str], n: int, seed: int, text_field: str) -> list[str]:
    """A seeded uniform sample of n corpus documents (the "low quality" class, as in DCLM)."""
    texts = [t for p in files for t in read_table(p, text_field).column("text").to_pylist() if t]
    rng = random.Random(seed)
    return (
        texts if len(texts) <= n else [texts[i] for i in sorted(rng.sample(range(len(texts)), n))]
    )


def train(cfg: ClassifyConfig, files: list[str]) -> Classifier:
    if cfg.kind == "domain" and not cfg.labelled:
        raise ConfigError("classify.labelled: a domain classifier needs labelled examples")
    if cfg.labelled:
        texts, labels = read_labelled(
            cfg.labelled, cfg.text_field, cfg.label_field, cfg.label_threshold
        )
        if cfg.kind == "quality" and not set(labels) <= {HIGH, LOW}:
            raise InputError(
                f"classify.labelled: a quality classifier needs labels {HIGH}/{LOW} or numbers "
                f"with label_threshold (got {sorted(set(labels))[:5]})"
            )
    else:
        if not cfg.high_quality:
            raise ConfigError("classify.high_quality: expected files or folders of good text")
        good = read_texts(cfg.high_quality, "classify.high_quality", cfg.text_field)
        other = corpus_sample(files, cfg.sample_docs, cfg.seed, cfg.text_field)
        texts, labels = good + other, [HIGH] * len(good) + [LOW] * len(other)
    return train_classifier(cfg, texts, labels)


COLUMN = {"quality": "quality_score", "domain": "domain_prob", "perplexity": "perplexity"}
LABEL_COLUMN = {
    "quality": "quality_label",
    "domain": "domain_pred",
    "perplexity": "perplexity_bucket",
}


def _count(values: list[str], into: dict[str, int]) -> None:
    for v in values:
        into[v] = into.get(v, 0) + 1


def _keep(cfg: ClassifyConfig, table: pa.Table, cut) -> tuple[pa.Table, np.ndarray]:
    """(the table, with `perplexity_bucket` for perplexity; which rows stay)."""
    if cfg.kind == "quality":
        ids = [str(x) for x in table.column("id").to_pylist()]
        score = table.column("quality_score").to_numpy()
        return table, keep_mask(score, ids, cfg.keep, cut, cfg.seed)
    if cfg.kind == "perplexity":
        bucket = buckets(table.column("perplexity").to_numpy(), cut)
        table = table.append_column("perplexity_bucket", pa.array(bucket.tolist(), pa.string()))
        return table, np.isin(bucket, cfg.perplexity.keep_buckets)
    if cfg.keep.domains is None:
        return table, np.ones(table.num_rows, dtype=bool)
    pred = table.column("domain_pred").to_numpy(zero_copy_only=False)
    return table, np.isin(pred, cfg.keep.domains)


def _write(table: pa.Table, keep: np.ndarray, i: int, reason: str, out_dir: str) -> None:
    if keep.any():
        path = os.path.join(out_dir, f"shard-{i:05d}.parquet")
        pq.write_table(table.filter(pa.array(keep)), path, compression="zstd")
    if not keep.all():
        rej = table.filter(pa.array(~keep))
        rej = rej.append_column("reason", pa.array([reason] * rej.num_rows, pa.string()))
        path = os.path.join(out_dir, "rejected", f"part-{i:05d}.parquet")
        pq.write_table(rej, path, compression="zstd")


def _select(cfg: ClassifyConfig, parts: list[str], out_dir: str) -> tuple[int, int, dict]:
    """Keep or reject every scored document; returns (in, kept, report fields)."""
    column = COLUMN[cfg.kind]
    scores = np.concatenate(
        [pq.read_table(p, columns=[column]).column(column).to_numpy() for p in parts] or [[]]
    )
    if cfg.kind == "perplexity":
        p = cfg.perplexity
        cut = bucket_cutoffs(scores, p.head_percent, p.tail_percent)
    else:
        cut = cutoff(scores, cfg.keep) if cfg.kind == "quality" else 0.0
    n_in = kept = 0
    kept_scores = []
    label_in: dict[str, int] = {}
    label_kept: dict[str, int] = {}
    for i, path in enumerate(parts):
        table, keep = _keep(cfg, pq.read_table(path), cut)
        n_in, kept = n_in + table.num_rows, kept + int(keep.sum())
        kept_scores.append(table.column(column).to_numpy()[keep])
        labels = table.column(LABEL_COLUMN[cfg.kind]).to_pylist()
        _count(labels, label_in)
        _count([x for x, k in zip(labels, keep, strict=True) if k], label_kept)
        _write(table, keep, i, cfg.kind, out_dir)
    bins = cfg.histogram_bins
    span = None
    if cfg.kind == "perplexity":
        finite = scores[np.isfinite(scores)]
        span = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    fields = {
        "keep": cfg.perplexity.model_dump() if cfg.kind == "perplexity" else cfg.keep.model_dump(),
        "cutoff": cut,
        "score_column": column,
        "histogram": histogram(scores, bins, span),
        "kept_histogram": histogram(np.concatenate(kept_scores or [[]]), bins, span),
        # documents per predicted label (quality high/low, domain, perplexity bucket): in, kept
        "label_counts": {k: label_in[k] for k in sorted(label_in)},
        "kept_label_counts": {k: label_kept.get(k, 0) for k in sorted(label_in)},
        "removed_by_reason": {cfg.kind: n_in - kept} if n_in > kept else {},
    }
    return n_in, kept, fields


def _prepare(output_dir: str) -> str:
    if glob.glob(os.path.join(output_dir, "shard-*.parquet")):
        raise InputError(f"{output_dir}: already holds shards (expected an empty output folder)")
    work = os.path.join(output_dir, "_work")
    for d in (work, os.path.join(output_dir, "rejected")):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    return work


def classify(cfg: ClassifyConfig, output_dir: str) -> dict:
    """Classify `cfg.input` into `output_dir`; returns the report (also in report.json)."""
    t0 = time.perf_counter()
    files = expand(cfg.input, "classify.input")
    work = _prepare(output_dir)
    model_dir = os.path.join(output_dir, "model")
    meta: dict = {}
    if cfg.kind == "perplexity":
        p = cfg.perplexity
        if not p.model or not p.tokenizer:
            raise ConfigError("classify.perplexity: model and tokenizer are required")
        meta = {"path": p.model, "tokenizer": p.tokenizer, "labels": list(BUCKETS)}
    elif cfg.model:
        clf = load_classifier(cfg.model)
        shutil.copytree(cfg.model, model_dir, dirs_exist_ok=True)
        meta = {**clf.meta, "path": model_dir}
    else:
        clf = train(cfg, files)
        clf.save(model_dir)
        meta = {**clf.meta, "path": model_dir}
    spec = {"kind": cfg.kind, "model_dir": model_dir, "perplexity": cfg.perplexity.model_dump()}
    t1 = time.perf_counter()
    started = None
    if cfg.cluster == "ray":
        import ray

        if not ray.is_initialized():
            started = Runtime().ensure()
    try:
        parts = score_files(files, spec, work, cfg.text_field, cfg.cluster, cfg.actors)
    finally:
        if started is not None:
            started.shutdown()
    t2 = time.perf_counter()
    n_in, kept, fields = _select(cfg, parts, output_dir)
    shutil.rmtree(work, ignore_errors=True)
    seconds = {"train": t1 - t0, "score": t2 - t1, "total": time.perf_counter() - t0}
    report = {
        "kind": cfg.kind,
        "classifier": None if cfg.kind == "perplexity" else cfg.classifier,
        "documents_in": n_in,
        "kept": kept,
        "rejected": n_in - kept,
        "invariant_holds": n_in == kept + sum(fields["removed_by_reason"].values()),
        **fields,
        "model": meta,
        "cluster": cfg.cluster,
        "seconds": seconds,
        "score_docs_per_s": n_in / seconds["score"] if seconds["score"] else 0.0,
    }
    write_report(report, os.path.join(output_dir, "report.json"))
    log.info("classified %d documents: %d kept (%.1f s)", n_in, kept, seconds["total"])
    return report
