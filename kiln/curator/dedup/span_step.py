"""The curate stage's substring and sentence dedup: run on what exact, fuzzy and semantic dedup
kept, in `_row` order; cut texts are written back into the staging parts, and documents left too
short are returned as rows to reject (reasons `substring_dedup`, `sentence_dedup`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.dedup.config import DedupConfig
from kiln.curator.dedup.sentence import find_sentence_removals
from kiln.curator.dedup.substring import (
    Removals,
    apply_removals,
    find_substring_removals,
    shards_of,
)

SUBSTRING_DEDUP = "substring_dedup"
SENTENCE_DEDUP = "sentence_dedup"


def _live(path: str, skip: np.ndarray) -> tuple[np.ndarray, list[str]]:
    table = pq.read_table(path, columns=["_row", "text"])
    rows = table.column("_row").to_numpy()
    live = ~np.isin(rows, skip)
    texts = table.column("text").to_pylist()
    return rows[live], [t for t, keep in zip(texts, live, strict=True) if keep]


def _bytes(staging: list[str]) -> int:
    """Uncompressed bytes of the staging parts: an upper bound of their text's characters."""
    total = 1
    for path in staging:
        meta = pq.read_metadata(path)
        total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return total


def _run_one(name, find, cfg, staging: list[str], skip: np.ndarray, work_dir: str):
    """One cutting step over the staging parts; returns (dropped rows, counts)."""

    def shards():
        for path in staging:
            yield from shards_of(_live(path, skip)[1], cfg.memory_limit_mb)

    found: list[Removals] = [
        r for shard in find(shards, cfg, work_dir, _bytes(staging)) for r in shard
    ]
    dropped, cut_docs, chars, at = [], 0, 0, 0
    for path in staging:
        rows, _ = _live(path, skip)
        mine, at = found[at : at + len(rows)], at + len(rows)
        if not any(r.ranges for r in mine):
            dropped += [row for row, r in zip(rows, mine, strict=True) if r.drop]
            continue
        table = pq.read_table(path)
        texts = table.column("text").to_pylist()
        index = {int(row): i for i, row in enumerate(table.column("_row").to_numpy())}
        for row, r in zip(rows, mine, strict=True):
            if r.drop:
                dropped.append(row)
            if r.ranges:
                i = index[int(row)]
                cut_docs += 1
                chars += sum(b - a for a, b in r.ranges)
                texts[i] = apply_removals(texts[i], r)
        col = table.schema.get_field_index("text")
        field = table.schema.field(col)
        table = table.set_column(col, field, pa.array(texts, field.type))
        pq.write_table(table, path)
    dropped = np.sort(np.array(dropped, dtype=np.int64))
    counts = {f"{name}_removed": len(dropped), f"{name}_documents_cut": cut_docs}
    counts[f"{name}_chars_cut"] = chars
    return dropped, counts


def cut_repeats(
    staging: list[str], skip: np.ndarray, cfg: DedupConfig, work_dir: str
) -> tuple[dict[str, np.ndarray], dict]:
    """Substring then sentence dedup (each when enabled) over the staging parts minus `skip`;
    returns the rows each step dropped (by reason) and its counts."""
    staging = sorted(staging)
    rejected: dict[str, np.ndarray] = {}
    counts: dict = {}
    steps = [
        (SUBSTRING_DEDUP, find_substring_removals, cfg.substring),
        (SENTENCE_DEDUP, find_sentence_removals, cfg.sentence),
    ]
    for name, find, step_cfg in steps:
        if not step_cfg.enabled:
            continue
        dropped, step_counts = _run_one(name, find, step_cfg, staging, skip, work_dir)
        rejected[name] = dropped
        counts.update(step_counts)
        skip = np.union1d(skip, dropped)
    return rejected, counts
