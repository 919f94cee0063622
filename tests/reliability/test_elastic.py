"""Node loss during training, elastic, and the node coming back: one Ray Train run over two nodes.

2 workers (FSDP, dp_shard=2, one per node) lose the worker node at step 2 and continue as 1
from the step-1 checkpoint: the sharded checkpoint reshards, gradient accumulation doubles so the
global batch is unchanged, the loader continues at the same global sample. The node is restarted
during step 2 on 1 worker; after its checkpoint the run grows back to 2 workers from it.
Every step's loss, in all three layouts, equals a single-process run's. (One worker per node: a
worker-group start is ~7 CPU s per worker here. That tp/pp/cp are kept while dp shrinks is
`test_elastic_plan.py`; a tp x pp x dp checkpoint resharding is `test_reshard.py`.)
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from kiln.training.checkpoint import latest_checkpoint, read_sidecar
from kiln.training.config import TrainConfig
from kiln.training.metrics_log import read_metrics
from tests.reliability.faults import NODE_BACK, NODE_REMOVED, PAUSE_STEP, REGROW_STEP

STEPS = 3  # a checkpoint after every step: 1 on 2 workers, 2 on 1, 3 on 2 again
CONFIG = {
    "model": "tiny",
    "parallel": {},  # dp_shard takes what the workers get
    "steps": STEPS,
    "seq_len": 32,
    "global_batch_size": 4,
    "micro_batch_size": 1,
    "log_every": 5,
    "data": {"synthetic": True},
    "checkpoint": {"interval_steps": 1},
}
RAY = {
    "cpus_per_worker": 1,  # 1 CPU per node: one worker on each
    "elastic": {"min_workers": 1, "max_workers": 2},
    "callbacks": ["tests.reliability.faults:pause_for_node_changes"],
}
DRIVER = """
import json, sys
from kiln.training.config import TrainConfig
from kiln.training.ray_train import RayOptions, train_on_ray
cfg = TrainConfig.model_validate(json.loads(sys.argv[1]))
summary = train_on_ray(cfg, sys.argv[3], RayOptions.model_validate(json.loads(sys.argv[2])))
print("SUMMARY " + json.dumps({k: summary[k] for k in ("world_size", "layout_changes")}))
"""


def _log_tail(path: str) -> str:
    with open(path) as f:
        return f.read()[-4000:]


def _single_process_losses(out: list) -> None:
    from kiln.training.trainer import Trainer

    cfg = TrainConfig.model_validate({**CONFIG, "parallel": {}})
    out.extend(m["loss"] for m in Trainer(cfg).train())


def _wait_for(predicate, timeout: float, what: str, proc, log_path: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {what} (driver rc {proc.poll()}):\n{_log_tail(log_path)}")
        time.sleep(0.1)


@pytest.mark.slow
def test_node_lost_then_back_shrinks_and_regrows_with_identical_losses(two_nodes, tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    log_path = str(tmp_path / "driver.log")
    args = ["-c", DRIVER, json.dumps(CONFIG), json.dumps(RAY), run_dir]
    started = time.monotonic()
    driver = two_nodes.driver(args, log_path)
    reference: list[float] = []
    ref_thread = threading.Thread(target=_single_process_losses, args=(reference,))
    ref_thread.start()  # meanwhile: Ray's start is mostly waiting
    try:
        paused = [os.path.join(run_dir, f"paused-rank{r}") for r in range(2)]
        reached = lambda: all(map(os.path.exists, paused))  # noqa: E731
        _wait_for(reached, 300, f"pause at step {PAUSE_STEP}", driver, log_path)
        two_nodes.kill_worker_node()
        open(os.path.join(run_dir, NODE_REMOVED), "w").close()
        shrunk = [os.path.join(run_dir, "shrunk-rank0")]
        reached = lambda: all(map(os.path.exists, shrunk))  # noqa: E731
        _wait_for(reached, 300, f"step {REGROW_STEP} on 1 worker", driver, log_path)
        two_nodes.start_worker_node()  # the node comes back (a new raylet, same resources)
        open(os.path.join(run_dir, NODE_BACK), "w").close()
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        ref_thread.join()
    out = _log_tail(log_path)
    assert driver.returncode == 0, out
    print(f"elastic run: {time.monotonic() - started:.0f} s")
    summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])

    # both layout changes are recorded: when (the step resumed from), why, from/to what
    lost, back = summary["layout_changes"]
    assert (lost["from_workers"], lost["to_workers"], lost["resume_step"]) == (2, 1, 1)
    assert "WorkerGroupError" in lost["reason"] or "TrainingFailedError" in lost["reason"]
    assert (back["from_workers"], back["to_workers"], back["resume_step"]) == (1, 2, 2)
    assert "nodes returned" in back["reason"], back
    assert summary["world_size"] == 2

    history = read_metrics(run_dir)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    for h in history:  # dp halves then doubles, accumulation follows: global batch unchanged
        small = lost["resume_step"] < h["step"] <= back["resume_step"]
        assert (h["world_size"], h["dp_size"], h["grad_accum"]) == (
            (1, 1, 4) if small else (2, 2, 2)
        ), h
    assert history[1]["layout_change"]["to_workers"] == 1  # the first step after each change
    assert history[2]["layout_change"]["to_workers"] == 2
    # same losses as one process: the same samples in the same order (none skipped/repeated)
    for h in history:
        assert abs(h["loss"] - reference[h["step"] - 1]) < 1e-4, (h["step"], h["loss"])
    final = latest_checkpoint(os.path.join(run_dir, "ray", "kiln-train", "checkpoints"))
    sidecar = read_sidecar(final)
    assert sidecar["step"] == STEPS and sidecar["layout"]["dp_size"] == 2
    assert sidecar["tokens_seen"] == STEPS * 4 * 32
