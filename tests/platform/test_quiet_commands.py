"""Standalone commands print what `kiln run` prints: kiln's own lines and one summary table.
Ray's, Ray Data's and Ray Train's output (Python loggers, the C++ core worker's lines on fd 2,
progress bars) goes to `<out>/logs/` instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.platform.console_checks import assert_quiet

REPO = Path(__file__).resolve().parents[2]


def _kiln(cwd: Path, *args: str) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        env={**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, out.stderr


def _corpus(folder: Path) -> None:
    """80 English documents, distinct enough to survive exact dedup (fuzzy is off)."""
    import random

    rng = random.Random(0)
    words = ["the", "kiln", "fires", "clay", "into", "pottery", "and", "glaze", "melts", "over"]
    folder.mkdir()
    for part in range(2):
        with open(folder / f"part{part}.jsonl", "w") as f:
            for doc in range(40):
                text = " ".join(
                    " ".join(rng.choices(words, k=12)).capitalize() + "." for _ in range(6)
                )
                f.write(json.dumps({"id": f"{part}-{doc}", "text": text}) + "\n")


@pytest.mark.slow
def test_curate_tokenize_train_print_kiln_lines_and_a_table(tmp_path):
    _corpus(tmp_path / "docs")
    out, err = _kiln(
        tmp_path, "curate", "--input", "docs", "--out", "corpus", "--stream", "inline",
        "--set", "filters.languages=null", "--set", "dedup.fuzzy.enabled=false",
    )  # fmt: skip
    assert assert_quiet(out, err)["documents in"] == "80"

    # Ray Data: INFO lines, core_worker.cc warnings, bars and "A new progress UI" before
    out, err = _kiln(tmp_path, "tokenize", "corpus", "--out", "tok", "--vocab-size", "300")
    assert assert_quiet(out, err)["documents"] == "80"
    assert (tmp_path / "tok/logs/kiln.log").is_file()
    assert (tmp_path / "tok/logs/ray").is_symlink()  # this Ray session's logs

    (tmp_path / "train.yaml").write_text(
        "model: {preset: tiny, vocab_size: 300}\nseq_len: 32\nglobal_batch_size: 2\n"
        "micro_batch_size: 2\nsteps: 2\ndata: {paths: [tok/tokens]}\n"
    )
    out, err = _kiln(tmp_path, "train", "--config", "train.yaml", "--run-dir", "run")
    assert assert_quiet(out, err)["steps"] == "2"
    assert (tmp_path / "run/logs/stderr.log").is_file()
