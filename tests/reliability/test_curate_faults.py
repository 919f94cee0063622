"""Faults mid-`curate` (stream: ray): a streaming actor's worker SIGKILLed, and the worker node of
a 2-node cluster killed. Ray retries the lost tasks on a restarted actor and the corpus is
byte-identical to a clean run's; in = kept + rejected."""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import pytest

from kiln.curator.stages import CurateStage
from kiln.platform.artifact import Artifact
from kiln.platform.pipeline import Pipeline
from tests.curator.prose import prose
from tests.reliability.faults import KILL_TAG, PAUSE_TAG, fail_on_init_marker

DRIVER = """
import json, sys
from kiln.curator.stages import CurateStage
from kiln.platform.pipeline import Pipeline
result = Pipeline("cur", [CurateStage(json.loads(sys.argv[1]))], runs_dir=sys.argv[2]).run()
print("CORPUS " + result.artifact("curate.corpus").path)
"""


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


def _documents(tag: str = "", tagged=()) -> list[dict]:
    rng = random.Random(0)
    docs = [{"id": f"d{i}", "text": prose(rng)} for i in range(60)]
    for i in tagged:
        docs[i]["text"] += f" {tag} "
    docs[7]["text"] = docs[3]["text"]  # an exact duplicate
    for i in (5, 22, 51):
        docs[i]["text"] = "too short"  # rejected by the quality rules
    return docs


def _inputs(tmp_path: Path, docs: list[dict]) -> list[str]:
    files = []
    for part in range(4):  # four read tasks: a fault hits one, the others are unaffected
        path = tmp_path / f"in-{part}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs[part::4]))
        files.append(str(path))
    return files


def _check_same_corpus(faulty, clean) -> None:
    assert _digest(Path(faulty.path)) == _digest(Path(clean.path))
    counts = faulty.counts
    assert counts["input"] == 60 == counts["documents"] + counts["rejected"]
    assert counts["rejected"] >= 4  # three too short, one duplicate


def _curate(config: dict, runs_dir: Path, stream: str) -> Artifact:
    """One curate stage in this process (on the session's Ray for stream: ray)."""
    stage = CurateStage({**config, "stream": stream})
    result = Pipeline("cur", [stage], runs_dir=runs_dir).run(shutdown=False)
    return result.artifact("curate.corpus")


@pytest.mark.slow
def test_worker_killed_mid_curate_gives_identical_corpus(ray_session, tmp_path):
    marker = tmp_path / "killed"
    files = _inputs(tmp_path, _documents(f"{KILL_TAG}{marker}", tagged=[40]))
    config = {
        "input": files,
        "stream": "ray",
        "actors": 2,
        "filters": {"custom": ["tests.reliability.faults:KillWorkerOnce"]},
    }

    marker.touch()  # the clean reference (in-process, no Ray) does not kill itself
    clean = _curate(config, tmp_path / "clean", "inline")
    marker.unlink()
    faulty = _curate(config, tmp_path / "faulty", "ray")
    assert marker.exists()  # a streaming actor's worker was SIGKILLed mid-task
    _check_same_corpus(faulty, clean)


@pytest.mark.slow
def test_actor_dead_while_starting_is_replaced(ray_session, tmp_path):
    """A streaming actor that dies in its constructor is replaced (Ray Core does not restart it;
    without the replacement the whole curate fails on the first such death, as it did when a node
    went away while an actor started)."""
    files = _inputs(tmp_path, _documents("", tagged=[]))
    config = {
        "input": files,
        "actors": 2,
        "filters": {"custom": ["tests.reliability.faults:FailOnInitOnce"]},
    }

    clean = _curate(config, tmp_path / "clean", "inline")
    marker = Path(fail_on_init_marker())
    marker.touch()
    try:
        faulty = _curate(config, tmp_path / "faulty", "ray")
        assert not marker.exists()  # an actor took it and failed in its constructor
    finally:
        marker.unlink(missing_ok=True)
    _check_same_corpus(faulty, clean)


@pytest.mark.slow
def test_worker_node_lost_mid_curate_gives_identical_corpus(two_nodes_never_lost, tmp_path):
    """Two actors spread over the two nodes; the worker node's actor pauses inside its first
    task and the test kills the node: the task reruns on an actor restarted on the head."""
    marker = tmp_path / "paused-on-worker-node"
    # the first document of every input, so whichever task the worker node runs pauses
    files = _inputs(tmp_path, _documents(f"{PAUSE_TAG}{marker}", tagged=range(4)))
    config = {
        "input": files,
        "stream": "ray",
        "actors": 2,
        "filters": {"custom": ["tests.reliability.faults:PauseOnWorkerNode"]},
    }
    log_path = str(tmp_path / "driver.log")
    args = ["-c", DRIVER, json.dumps(config), str(tmp_path / "faulty")]
    driver = two_nodes_never_lost.driver(args, log_path)
    try:
        # meanwhile the clean reference, in this process (no worker node here: nothing pauses)
        clean = _curate(config, tmp_path / "clean", "inline")
        deadline = time.monotonic() + 180
        while not marker.exists():
            if driver.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no task paused on the worker node:\n{_tail(log_path)}")
            time.sleep(0.1)
        two_nodes_never_lost.kill_worker_node()
        driver.wait(timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = _tail(log_path)
    assert driver.returncode == 0, out
    faulty_path = out.split("CORPUS ", 1)[1].splitlines()[0]
    _check_same_corpus(Artifact.load(faulty_path), clean)


def _tail(path: str) -> str:
    with open(path) as f:
        return f.read()[-4000:]
