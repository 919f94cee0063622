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


def write_outputs(
    staging_files: list[str],
    exact_rows: np.ndarray,
    fuzzy_rows: np.ndarray,
    out_dir: str,
    rejected_dir: str,
    spill_dir: str,
    cfg: OutputConfig,
) -> int:
    """Write the kept documents as shards and the duplicates to rejected/; returns documents kept."""
    staging_files = sorted(staging_files)
    exact_rows, fuzzy_rows = np.sort(exact_rows), np.sort(fuzzy_rows)
    kept_per_file = []
    for path in staging_files:  # pass 1: duplicates out, count what stays
        table = pq.read_table(path, columns=["_row", *CORPUS_COLUMNS])
        rows = table.column("_row").to_numpy()
        is_exact, is_fuzzy = np.isin(rows, exact_rows), np.isin(rows, fuzzy_rows)
        dup = is_exact | is_fuzzy
        if dup.any():
            reason = np.where(is_exact[dup], EXACT_DUPLICATE, FUZZY_DUPLICATE)
            rej = (
                table.filter(pa.array(dup))
                .select(CORPUS_COLUMNS)
                .append_column("reason", pa.array(reason, pa.string()))
            )
            name = "dedup-" + os.path.basename(path)
            pq.write_table(
                rej.cast(REJECTED_SCHEMA),
                os.path.join(rejected_dir, name),
                compression=cfg.compression,
            )
        kept_per_file.append(~dup)
    total = int(sum(k.sum() for k in kept_per_file))
    if total == 0:
        return 0
    n_shards = -(-total // cfg.shard_docs)
    slot = np.random.default_rng(cfg.seed).permutation(total)
    os.makedirs(spill_dir, exist_ok=True)
    start = 0
    for i, (path, keep) in enumerate(
        zip(staging_files, kept_per_file, strict=True)
    ):  # pass 2: spill
        if not keep.any():
            continue
        table = pq.read_table(path, columns=CORPUS_COLUMNS).filter(pa.array(keep))
        pos = slot[start : start + table.num_rows]
        start += table.num_rows
        shard = pos // cfg.shard_docs
        table = table.append_column("_pos", pa.array(pos, pa.int64()))
        for s in np.unique(shard):
            piece = table.filter(pa.array(shard == s))
            d = os.path.join(spill_dir, f"{s:05d}")
            os.makedirs(d, exist_ok=True)
            pq.write_table(piece, os.path.join(d, f"{i:06d}.parquet"))
    for s in range(n_shards):  # pass 3: assemble each shard in permutation order
        d = os.path.join(spill_dir, f"{s:05d}")
        pieces = [pq.read_table(os.path.join(d, f)) for f in sorted(os.listdir(d))]
        table = pa.concat_tables(pieces)
        table = table.take(pc.sort_indices(table.column("_pos"))).select(CORPUS_COLUMNS)
        table = table.replace_schema_metadata(None)
        pq.write_table(
            table, os.path.join(out_dir, f"shard-{s:05d}.parquet"), compression=cfg.compression
        )
        shutil.rmtree(d)
    return total
