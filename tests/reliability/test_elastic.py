"""Node loss during training: a Ray Train run over two nodes loses one and continues, elastic.

4 workers (tp=2 x dp=2, two per node) become 2 (tp=2 x dp=1): the checkpoint reshards, gradient
accumulation doubles so the global batch is unchanged, the loader continues at the same global
sample. Every step's loss, before and after the change, equals a single-process run's.
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
from tests.reliability.faults import NODE_REMOVED, PAUSE_STEP

STEPS = 7  # checkpoints at 4 and 7 (the last); the pause is at step 6: 5-7 run on 2 workers
CONFIG = {
    "model": "tiny",
    "parallel": {"tp": 2},  # dp_shard takes what the workers leave
    "steps": STEPS,
    "seq_len": 32,
    "global_batch_size": 4,
    "micro_batch_size": 1,
    "log_every": 5,
    "data": {"synthetic": True},
    "checkpoint": {"interval_steps": 4},
}
RAY = {
    "cpus_per_worker": 0.5,  # 1 CPU per node: two workers on each
    "elastic": {"min_workers": 2, "max_workers": 4},
    "callbacks": ["tests.reliability.faults:pause_until_node_removed"],
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
def test_node_lost_mid_run_continues_on_half_the_workers(two_nodes, tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    log_path = str(tmp_path / "driver.log")
    args = ["-c", DRIVER, json.dumps(CONFIG), json.dumps(RAY), run_dir]
    driver = two_nodes.driver(args, log_path)
    reference: list[float] = []
    ref_thread = threading.Thread(target=_single_process_losses, args=(reference,))
    ref_thread.start()  # meanwhile: Ray's start is mostly waiting
    try:
        paused = [os.path.join(run_dir, f"paused-rank{r}") for r in range(4)]
        reached = lambda: all(map(os.path.exists, paused))  # noqa: E731
        _wait_for(reached, 180, f"pause at step {PAUSE_STEP}", driver, log_path)
        two_nodes.kill_worker_node()
        open(os.path.join(run_dir, NODE_REMOVED), "w").close()
        driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        ref_thread.join()
    out = _log_tail(log_path)
    assert driver.returncode == 0, out
    summary = json.loads(out.split("SUMMARY ", 1)[1].splitlines()[0])

    # the layout change is recorded: when (the step resumed from), why, and from/to what
    (change,) = summary["layout_changes"]
    assert (change["from_workers"], change["to_workers"]) == (4, 2)
    assert "WorkerGroupError" in change["reason"] or "TrainingFailedError" in change["reason"]
    resumed = change["resume_step"]
    assert resumed in (4,)  # the newest complete checkpoint before the pause at step 6

    history = read_metrics(run_dir)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1))
    for h in history:  # dp halves, accumulation doubles: the global batch is unchanged
        after = h["step"] > resumed
        assert (h["world_size"], h["dp_size"], h["grad_accum"]) == (
            (2, 1, 4) if after else (4, 2, 2)
        ), h
    assert history[resumed]["layout_change"]["to_workers"] == 2  # on the first step after
    # same losses as one process: the same samples in the same order (none skipped/repeated)
    for h in history:
        assert abs(h["loss"] - reference[h["step"] - 1]) < 1e-4, (h["step"], h["loss"])
    final = latest_checkpoint(os.path.join(run_dir, "ray", "kiln-train", "checkpoints"))
    sidecar = read_sidecar(final)
    assert sidecar["step"] == STEPS and sidecar["layout"]["dp_size"] == 1
    assert sidecar["tokens_seen"] == STEPS * 4 * 32
