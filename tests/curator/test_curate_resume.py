"""Shard-level resume of `curate`: a `kiln run` SIGKILLed after a random number of streamed
input shards, run again, streams only the unfinished shards and writes the same bytes as an
uninterrupted run."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from kiln.platform.spec import load_pipeline
from tests.curator.prose import prose

SHARDS = 10


def _spec(tmp_path, runs: str, inputs: str) -> str:
    spec = tmp_path / f"{runs}.yaml"
    spec.write_text(
        f"pipeline: resume\nruns_dir: {tmp_path / runs}\nstages:\n"
        f"  - stage: curate\n    config: {{input: [{inputs}], stream: inline}}\n"
    )
    return str(spec)


def _files(folder: str) -> dict[str, bytes]:
    """Every shard and rejected part of a curated corpus, by relative path."""
    paths = glob.glob(f"{folder}/shard-*.parquet") + glob.glob(f"{folder}/rejected/*.parquet")
    return {os.path.relpath(p, folder): open(p, "rb").read() for p in sorted(paths)}


def _curate_metrics(result) -> dict:
    with open(result.run_dir / "run.json") as f:
        return json.load(f)["stages"]["curate"]["metrics"]


@pytest.mark.slow
def test_curate_killed_at_a_random_shard_resumes_byte_identical(tmp_path):
    rng = random.Random(39)
    inputs = tmp_path / "in"
    inputs.mkdir()
    docs = [{"id": f"d{i}", "text": prose(rng)} for i in range(SHARDS * 150)]
    docs[7]["text"] = docs[3]["text"]  # an exact duplicate across shards
    for s in range(SHARDS):
        part = docs[s * 150 : (s + 1) * 150]
        (inputs / f"part-{s:02d}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in part))
    whole = load_pipeline(_spec(tmp_path, "whole", str(inputs))).run(shutdown=False)
    assert _curate_metrics(whole)["tasks_resumed"] == 0

    spec = _spec(tmp_path, "killed", str(inputs))
    kill_after = rng.randint(1, SHARDS - 4)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "run", spec],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    done = str(tmp_path / "killed" / "resume" / ".work" / "curate-*" / "stream" / "done" / "*.json")
    while len(glob.glob(done)) < kill_after:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(glob.glob(done))
    assert kill_after <= finished < SHARDS

    again = load_pipeline(spec).run(shutdown=False)
    metrics = _curate_metrics(again)
    assert metrics["tasks_resumed"] == finished
    assert metrics["tasks_processed"] == SHARDS - finished
    out = again.artifact("curate.corpus").path
    files = _files(out)
    assert files == _files(whole.artifact("curate.corpus").path)
    assert "shard-00000.parquet" in files and any(f.startswith("rejected/") for f in files)
    assert not glob.glob(done)  # the work folder is gone once the stage succeeds
