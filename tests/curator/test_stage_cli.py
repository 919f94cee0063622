"""The `curate` stage in a Pipeline (artifact, counts, cache key from input files) and the CLI."""

from __future__ import annotations

import glob
import json
import os
import random

import pyarrow.parquet as pq
import pytest

from kiln.curator.stages import CurateStage
from kiln.platform.cli import main
from kiln.platform.errors import ConfigError
from kiln.platform.pipeline import Pipeline
from tests.curator.prose import prose


def _input(tmp_path) -> str:
    rng = random.Random(0)
    path = tmp_path / "in.jsonl"
    docs = [{"id": f"d{i}", "text": prose(rng)} for i in range(12)] + [{"id": "copy", "text": "x"}]
    docs[-1]["text"] = docs[0]["text"]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs) + "{broken\n")
    return str(path)


def test_stage_in_a_pipeline(tmp_path):
    path = _input(tmp_path)
    stage = CurateStage({"input": [path], "stream": "inline"})
    result = Pipeline("cur", [stage], runs_dir=tmp_path / "runs").run(shutdown=False)
    art = result.artifact("curate.corpus")
    assert art.kind == "Corpus" and art.counts == {"documents": 12, "rejected": 2, "input": 14}
    assert len(pq.read_table(glob.glob(f"{art.path}/shard-*.parquet")).column("id")) == 12
    fp = stage.extra_fingerprint()
    os.utime(path, ns=(1, 1))
    assert CurateStage({"input": [path], "stream": "inline"}).extra_fingerprint() != fp


def test_cli(tmp_path, capsys):
    path = _input(tmp_path)
    cfg = tmp_path / "curate.yaml"
    cfg.write_text("filters:\n  languages: [en]\noutput:\n  shard_docs: 5\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "curate",
                "--input",
                path,
                "--output",
                str(out),
                "--config",
                str(cfg),
                "--stream",
                "inline",
            ]
        )
        == 0
    )
    out_lines = capsys.readouterr().out.splitlines()  # a summary table, not a JSON dump
    assert "  kept          12" in out_lines, out_lines
    assert len(glob.glob(f"{out}/shard-*.parquet")) == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("filters:\n  min_wrods: 3\n")
    assert (
        main(["curate", "--input", path, "--output", str(tmp_path / "o2"), "--config", str(bad)])
        == 2
    )
    assert "curate.filters.min_wrods: unknown field" in capsys.readouterr().err


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="curate.dedup.fuzzy.bands"):
        CurateStage({"dedup": {"fuzzy": {"bands": 0}}}, name="curate")
