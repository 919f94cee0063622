"""A Ray Data worker SIGKILLed mid-`curate` (stream: ray): Ray retries its task on a new actor and
the corpus is byte-identical to a clean run's; in = kept + rejected."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from kiln.curator.stage import CurateStage
from kiln.platform.pipeline import Pipeline
from tests.curator.corpus import prose
from tests.reliability.faults import KILL_TAG


def _digest(folder: Path) -> dict[str, str]:
    """sha256 of every data file of a corpus (parquet shards, rejected/), and its report's
    counts (the report also holds timings)."""
    files = {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix == ".parquet"
    }
    report = json.loads((folder / "report.json").read_text())
    for timing in ("seconds", "docs_per_s", "cluster", "stream"):  # how, not what
        report.pop(timing, None)
    return {**files, "report": json.dumps(report, sort_keys=True)}


@pytest.mark.slow
def test_worker_killed_mid_curate_gives_identical_corpus(ray_session, tmp_path):
    marker = tmp_path / "killed"
    rng = random.Random(0)
    docs = [{"id": f"d{i}", "text": prose(rng)} for i in range(60)]
    docs[40]["text"] += f" {KILL_TAG}{marker} "
    docs[7]["text"] = docs[3]["text"]  # an exact duplicate
    for i in (5, 22, 51):
        docs[i]["text"] = "too short"  # rejected by the quality rules
    files = []
    for part in range(4):  # four read tasks: the kill hits one, the others are unaffected
        path = tmp_path / f"in-{part}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs[part::4]))
        files.append(str(path))
    config = {
        "input": files,
        "stream": "ray",
        "actors": 2,
        "filters": {"custom": ["tests.reliability.faults:KillWorkerOnce"]},
    }

    def curate(runs: str, stream: str):
        stage = CurateStage({**config, "stream": stream})
        result = Pipeline("cur", [stage], runs_dir=tmp_path / runs).run(shutdown=False)
        return result.artifact("curate.corpus")

    marker.touch()  # the clean reference (in-process, no Ray) does not kill itself
    clean = curate("clean", "inline")
    marker.unlink()
    faulty = curate("faulty", "ray")
    assert marker.exists()  # a Ray Data worker was SIGKILLed mid-task
    assert _digest(Path(faulty.path)) == _digest(Path(clean.path))
    counts = faulty.counts
    assert counts["input"] == 60 == counts["documents"] + counts["rejected"]
    assert counts["rejected"] >= 4  # three too short, one duplicate
