"""The dedup step: exact, then fuzzy on what exact dedup kept; returns the `_row` keys to drop."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.curator.config import CurateConfig
from kiln.curator.dedup.components import duplicates_from_edges
from kiln.curator.dedup.engine import cugraph_available
from kiln.curator.dedup.exact import exact_duplicate_rows
from kiln.curator.dedup.lsh import candidate_pairs
from kiln.curator.dedup.memory import check_dedup_memory
from kiln.curator.dedup.semantic import semantic_duplicate_rows
from kiln.curator.dedup.verify import verify_pairs
from kiln.curator.process import band_columns


@dataclass
class DedupResult:
    exact_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    fuzzy_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    semantic_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    counts: dict = field(default_factory=dict)


def _to_pandas(df):
    return df.to_pandas() if hasattr(df, "to_pandas") else df


ROWS_PER_PARTITION = 250_000  # ~50 MB of dedup keys per pandas partition


def run_dedup(
    staging_files: list[str], cfg: CurateConfig, backend: str = "pandas", n_docs: int = 0
) -> DedupResult:
    if backend == "pandas":  # the figures are host memory; cuDF's live on the GPU
        check_dedup_memory(n_docs, cfg.dedup)
    result = exact_and_fuzzy(staging_files, cfg, backend, n_docs)
    if cfg.dedup.semantic.enabled and staging_files:  # opt-in, on what exact/fuzzy kept
        skip = np.concatenate([result.exact_rows, result.fuzzy_rows])
        result.semantic_rows, clusters = semantic_duplicate_rows(
            staging_files, skip, cfg.dedup.semantic
        )
        result.counts["semantic_duplicates"] = len(result.semantic_rows)
        result.counts["semantic_clusters"] = clusters
    return result


def exact_and_fuzzy(
    staging_files: list[str], cfg: CurateConfig, backend: str, n_docs: int
) -> DedupResult:
    result = DedupResult()
    if not staging_files or not (cfg.dedup.exact or cfg.dedup.fuzzy.enabled):
        return result  # before importing Dask: ~1 s a filter-only run has no use for
    import dask.dataframe as dd

    fz = cfg.dedup.fuzzy
    bands = band_columns(fz.bands) if fz.enabled else []
    key = ["_hash"] if cfg.dedup.exact else []  # the stream writes it for exact dedup only
    ddf = dd.read_parquet(staging_files, columns=["_row", "id", *key, *bands])
    ddf = ddf.repartition(
        npartitions=cfg.dask_partitions or max(1, -(-n_docs // ROWS_PER_PARTITION))
    )
    if cfg.dedup.exact:
        result.exact_rows = exact_duplicate_rows(ddf).to_numpy()
        result.counts["exact_duplicates"] = len(result.exact_rows)
    if fz.enabled:
        survivors = (
            ddf[~ddf["_row"].isin(result.exact_rows.tolist())] if len(result.exact_rows) else ddf
        )
        pairs = _to_pandas(candidate_pairs(survivors, bands, fz.max_bucket_size).compute())
        result.counts["candidate_pairs"] = len(pairs)
        if fz.verify:
            texts = dd.read_parquet(staging_files, columns=["_row", "text"])
            edges = verify_pairs(pairs, texts, fz.ngram, fz.threshold)
        else:
            edges = pairs
        result.counts["duplicate_pairs"] = len(edges)
        result.fuzzy_rows, clusters = duplicates_from_edges(
            edges, use_cugraph=backend == "cudf" and cugraph_available()
        )
        result.counts["fuzzy_duplicates"] = len(result.fuzzy_rows)
        result.counts["fuzzy_clusters"] = clusters
    return result
