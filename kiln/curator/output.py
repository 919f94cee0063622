"""Output: seeded-shuffled zstd Parquet shards and the dedup part of `rejected/`.

The shuffle is external and deterministic: documents are numbered in `_row` order, a seeded
permutation gives each its shard and position, pieces are spilled per shard, and each shard is
assembled and sorted by position. Memory holds one staging part or one shard at a time.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.curator.config import OutputConfig
from kiln.curator.process import REJECTED_SCHEMA

CORPUS_COLUMNS = ["id", "text", "source", "language"]
EXACT_DUPLICATE = "exact_duplicate"
FUZZY_DUPLICATE = "fuzzy_duplicate"
SEMANTIC_DUPLICATE = "semantic_duplicate"


def write_outputs(
    staging_files: list[str],
    exact_rows: np.ndarray,
    fuzzy_rows: np.ndarray,
    out_dir: str,
    rejected_dir: str,
    spill_dir: str,
    cfg: OutputConfig,
    semantic_rows: np.ndarray | None = None,
    more_rows: dict[str, np.ndarray] | None = None,
) -> int:
    """Write the kept documents as shards and the duplicates to rejected/; returns how many
    documents were kept. `more_rows`: further rows to reject, by reason."""
    staging_files = sorted(staging_files)
    exact_rows, fuzzy_rows = np.sort(exact_rows), np.sort(fuzzy_rows)
    kept_per_file = [
        reject_duplicates(path, exact_rows, fuzzy_rows, rejected_dir, cfg, semantic_rows, more_rows)
        for path in staging_files
    ]
    total = int(sum(k.sum() for k in kept_per_file))
    if total == 0:
        return 0
    slot = np.random.default_rng(cfg.seed).permutation(total)
    if total <= cfg.shard_docs:  # one shard, held whole either way: no spill and read back
        write_one_shard(staging_files, kept_per_file, slot, out_dir, cfg)
        return total
    spill_by_shard(staging_files, kept_per_file, slot, spill_dir, cfg.shard_docs)
    for shard in range(-(-total // cfg.shard_docs)):
        assemble_shard(spill_dir, shard, out_dir, cfg)
    return total


def reject_duplicates(
    path: str,
    exact_rows: np.ndarray,
    fuzzy_rows: np.ndarray,
    rejected_dir: str,
    cfg: OutputConfig,
    semantic_rows: np.ndarray | None = None,
    more_rows: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Pass 1: write one staging part's duplicates to rejected/; returns its keep mask."""
    drop = [exact_rows, fuzzy_rows, semantic_rows, *(more_rows or {}).values()]
    if not any(r is not None and len(r) for r in drop):  # no dedup removed anything: no read
        return np.ones(pq.ParquetFile(path).metadata.num_rows, dtype=bool)
    table = pq.read_table(path, columns=["_row", *CORPUS_COLUMNS])
    rows = table.column("_row").to_numpy()
    is_exact, is_fuzzy = np.isin(rows, exact_rows), np.isin(rows, fuzzy_rows)
    is_semantic = np.isin(rows, semantic_rows if semantic_rows is not None else [])
    dup = is_exact | is_fuzzy | is_semantic
    reasons = np.where(is_exact, EXACT_DUPLICATE, np.where(is_fuzzy, FUZZY_DUPLICATE, ""))
    reasons = np.where(is_semantic & ~(is_exact | is_fuzzy), SEMANTIC_DUPLICATE, reasons)
    for name, more in (more_rows or {}).items():  # disjoint from the rows above and each other
        is_more = np.isin(rows, more)
        reasons = np.where(is_more, name, reasons)
        dup |= is_more
    if dup.any():
        reason = reasons[dup].astype(str)
        rejected = (
            table.filter(pa.array(dup))
            .select(CORPUS_COLUMNS)
            .append_column("reason", pa.array(reason, pa.string()))
        )
        pq.write_table(
            rejected.cast(REJECTED_SCHEMA),
            os.path.join(rejected_dir, "dedup-" + os.path.basename(path)),
            compression=cfg.compression,
        )
    return ~dup


def spill_by_shard(
    staging_files: list[str],
    kept_per_file: list[np.ndarray],
    slot: np.ndarray,
    spill_dir: str,
    shard_docs: int,
) -> None:
    """Pass 2: give each kept document (in `_row` order) its permuted position and spill it to
    its shard's folder."""
    os.makedirs(spill_dir, exist_ok=True)
    start = 0
    for i, (path, keep) in enumerate(zip(staging_files, kept_per_file, strict=True)):
        if not keep.any():
            continue
        table = pq.read_table(path, columns=CORPUS_COLUMNS).filter(pa.array(keep))
        pos = slot[start : start + table.num_rows]
        start += table.num_rows
        shard = pos // shard_docs
        table = table.append_column("_pos", pa.array(pos, pa.int64()))
        for s in np.unique(shard):
            d = os.path.join(spill_dir, f"{s:05d}")
            os.makedirs(d, exist_ok=True)
            pq.write_table(table.filter(pa.array(shard == s)), os.path.join(d, f"{i:06d}.parquet"))


def write_one_shard(
    staging_files: list[str],
    kept_per_file: list[np.ndarray],
    slot: np.ndarray,
    out_dir: str,
    cfg: OutputConfig,
) -> None:
    """Passes 2 and 3 when every kept document fits one shard: the same bytes as spilling and
    assembling it (documents in `slot` order), without writing and reading the spill."""
    tables = [
        pq.read_table(path, columns=CORPUS_COLUMNS).filter(pa.array(keep))
        for path, keep in zip(staging_files, kept_per_file, strict=True)
        if keep.any()
    ]
    table = pa.concat_tables(tables).take(pa.array(np.argsort(slot)))
    pq.write_table(
        table.replace_schema_metadata(None),
        os.path.join(out_dir, "shard-00000.parquet"),
        compression=cfg.compression,
    )


def assemble_shard(spill_dir: str, shard: int, out_dir: str, cfg: OutputConfig) -> None:
    """Pass 3: one shard's spilled pieces, sorted by permuted position, as `shard-NNNNN.parquet`."""
    d = os.path.join(spill_dir, f"{shard:05d}")
    table = pa.concat_tables([pq.read_table(os.path.join(d, f)) for f in sorted(os.listdir(d))])
    table = table.take(pc.sort_indices(table.column("_pos"))).select(CORPUS_COLUMNS)
    pq.write_table(
        table.replace_schema_metadata(None),
        os.path.join(out_dir, f"shard-{shard:05d}.parquet"),
        compression=cfg.compression,
    )
    shutil.rmtree(d)
