"""The output step's one-shard path (every kept document fits one shard) writes the bytes the
spill-and-assemble path writes, with duplicates still going to rejected/."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.config import OutputConfig
from kiln.curator.output import (
    assemble_shard,
    reject_duplicates,
    spill_by_shard,
    write_outputs,
)


def _staging(folder: str, n_files: int = 3, per_file: int = 25) -> list[str]:
    """Staging parts as the stream writes them: `_row` ascending, one file per task."""
    rng = np.random.default_rng(0)
    paths = []
    for f in range(n_files):
        rows = (np.int64(f) << np.int64(32)) + np.arange(per_file, dtype=np.int64)
        table = pa.table(
            {
                "_row": pa.array(rows, pa.int64()),
                "id": [f"f{f}-{i}" for i in range(per_file)],
                "text": pa.array(
                    [f"document {f}/{i} " * int(rng.integers(1, 20)) for i in range(per_file)],
                    pa.large_string(),
                ),
                "source": [f"part-{f}.jsonl"] * per_file,
                "language": ["en" if i % 3 else None for i in range(per_file)],
                "_hash": pa.array(rng.integers(-(2**62), 2**62, per_file), pa.int64()),
            }
        )
        paths.append(os.path.join(folder, f"part-{f:05d}-0000.parquet"))
        pq.write_table(table, paths[-1], compression="zstd")
    return paths


def test_one_shard_path_writes_the_spilled_bytes(tmp_path):
    staging = _staging(str(tmp_path))
    exact = np.array([(0 << 32) + 3, (1 << 32) + 7, (2 << 32) + 24], dtype=np.int64)
    fuzzy = np.array([(1 << 32) + 0], dtype=np.int64)
    cfg = OutputConfig(shard_docs=1000, seed=5)
    for d in ("direct", "spilled", "rej-direct", "rej-spilled"):
        os.makedirs(tmp_path / d)

    kept = write_outputs(
        staging, exact, fuzzy, str(tmp_path / "direct"), str(tmp_path / "rej-direct"),
        str(tmp_path / "spill-direct"), cfg,
    )  # fmt: skip
    assert kept == 75 - 4
    assert os.listdir(tmp_path / "direct") == ["shard-00000.parquet"]
    assert not os.path.exists(tmp_path / "spill-direct")  # nothing spilled

    # the general path by hand: passes 1-3 into one shard
    keep = [reject_duplicates(p, exact, fuzzy, str(tmp_path / "rej-spilled"), cfg) for p in staging]
    slot = np.random.default_rng(cfg.seed).permutation(kept)
    spill_by_shard(staging, keep, slot, str(tmp_path / "spill"), cfg.shard_docs)
    assemble_shard(str(tmp_path / "spill"), 0, str(tmp_path / "spilled"), cfg)

    direct = (tmp_path / "direct" / "shard-00000.parquet").read_bytes()
    assert direct == (tmp_path / "spilled" / "shard-00000.parquet").read_bytes()
    # the shard is the kept documents in permuted order, duplicates excluded
    ids = pq.read_table(tmp_path / "direct" / "shard-00000.parquet").column("id").to_pylist()
    in_order = [i for p in staging for i in pq.read_table(p).column("id").to_pylist()]
    in_order = [i for i in in_order if i not in ("f0-3", "f1-7", "f2-24", "f1-0")]
    assert ids == [in_order[k] for k in np.argsort(slot)]
    assert sorted(os.listdir(tmp_path / "rej-direct")) == sorted(
        os.listdir(tmp_path / "rej-spilled")
    )
