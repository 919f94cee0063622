"""`kiln plan` takes `--set` like `kiln run`/`kiln train` and prints one table row per rank,
after a progress line per rank."""

from __future__ import annotations

from kiln.platform.cli import main

SPEC = """pipeline: p
stages:
  - stage: train
    config:
      model: tiny
      parallel: {dp_shard: 2}
      seq_len: 64
"""


def test_plan_takes_set_and_prints_a_table(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    argv = ["plan", str(spec), "--set", "train.parallel.tp=2", "--set", "train.parallel.dp_shard=1"]
    assert main([*argv, "--ranks", "0,-1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "planning train: rank 0 of 2 (1/2)",
        "planning train: rank 1 of 2 (2/2)",
    ]
    header, *rows = captured.out.splitlines()
    assert header.split()[:3] == ["stage", "rank", "world"] and "peak GiB" in header
    assert [row.split()[:3] for row in rows] == [["train", "0", "2"], ["train", "1", "2"]]


def test_plan_set_typo_is_blamed_on_set(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    assert main(["plan", str(spec), "--set", "train.parallel.tpp=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "kiln: error: --set train.parallel.tpp=2: unknown field (did you mean 'tp'?)"
