"""A laid-out GRPO or distillation run (`parallel:`) on Ray Train: one worker per rank, each
running the run function the torchrun entry point runs (`run_grpo` / `run_distill`, which lay
the policy out over the process group Ray Train started: layouts.py). Rank 0 writes the
Checkpoint and run.json; its step metrics come back through a JSONL file the driver follows,
so the caller's `on_step` (the stage's progress and metrics, the command's line per step) sees
every step as in one process. Without a layout (or a layout of one rank) the run stays in this
process.

The workers run on CPU over gloo (the loops build the policy on the CPU); the rollout engines
are as in one process: in-process (every rank an engine, each sampling a share), or Ray actors
started by rank 0. Paths are made absolute: the workers' folder is not the driver's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from kiln.platform.runtime import Runtime, default_cpus_per_worker
from kiln.training.launch import process_group_backend
from kiln.training.lean_trainer import LeanTorchTrainer
from kiln.training.preflight import check_resources
from kiln.training.ray_train import ray_train_failure
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.distill_config import DistillRunConfig
from kiln.training.rl.distill_run import run_distill
from kiln.training.rl.layouts import layout_world_size
from kiln.training.rl.run import RUN_FILE, run_grpo
from kiln.training.worker_errors import worker_error

# objective -> (its run function, its config class)
RUNS: dict[str, tuple[Callable, type]] = {
    "grpo": (run_grpo, GRPORunConfig),
    "distill": (run_distill, DistillRunConfig),
}
STEPS_FILE = "steps.jsonl"  # rank 0's step metrics, followed by the driver
PATH_FIELDS = ("base", "teacher", "prompts", "eval_prompts")


def run_anywhere(
    objective: str,
    cfg,
    out_dir: str,
    on_step: Callable[[dict], None] | None = None,
    state_dir: str | None = None,
    runtime: Runtime | None = None,
) -> dict[str, Any]:
    """`cfg` run in this process, or on Ray Train when its `parallel:` needs several ranks;
    the run's summary either way (run.json's fields)."""
    run, _ = RUNS[objective]
    n = layout_world_size(cfg.parallel, f"{objective}.parallel")
    if n == 1:
        return run(cfg.model_copy(update={"parallel": None}), out_dir, on_step, state_dir)
    return run_on_ray_train(objective, cfg, out_dir, n, on_step, state_dir, runtime)


def run_on_ray_train(
    objective: str,
    cfg,
    out_dir: str,
    n: int,
    on_step: Callable[[dict], None] | None = None,
    state_dir: str | None = None,
    runtime: Runtime | None = None,
) -> dict[str, Any]:
    """`cfg` on `n` Ray Train workers; rank 0's run.json as the summary."""
    import ray.train
    from ray.train.torch import TorchConfig

    runtime = (runtime or Runtime()).ensure()
    cpus = default_cpus_per_worker(runtime.cpus)
    rollout_cpus = cfg.rollout.workers * cfg.rollout.cpus_per_worker
    # Ray Train waits forever for workers it cannot place: refused here in one line instead
    check_resources(n, cpus + rollout_cpus / n, False, runtime.cpus, 0, "the Ray cluster")
    update = {f: os.path.abspath(getattr(cfg, f)) for f in PATH_FIELDS if _local(cfg, f)}
    cfg = cfg.model_copy(update=update)
    out_dir = os.path.abspath(out_dir)
    channel = tempfile.mkdtemp(prefix=f"kiln-{objective}-ray-")
    follower = _StepFollower(os.path.join(channel, STEPS_FILE), on_step)
    trainer = LeanTorchTrainer(
        _rank_main,
        embedded=runtime.embedded,
        train_loop_config={
            "objective": objective,
            "cfg": cfg.model_dump(mode="json"),
            "out_dir": out_dir,
            "state_dir": os.path.abspath(state_dir) if state_dir else None,
            "steps_file": follower.path,
            "threads": max(1, int(cpus)),
        },
        torch_config=TorchConfig(backend=process_group_backend(False, False)),
        scaling_config=ray.train.ScalingConfig(
            num_workers=n, use_gpu=False, resources_per_worker={"CPU": cpus}
        ),
        run_config=ray.train.RunConfig(
            name=f"kiln-{objective}",
            storage_path=os.path.join(channel, "ray"),
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
    )
    try:
        with follower:
            trainer.fit()
    except ray_train_failure() as exc:
        raise worker_error(exc, out_dir) from None
    finally:
        shutil.rmtree(channel, ignore_errors=True)
    with open(os.path.join(out_dir, RUN_FILE)) as f:
        summary = json.load(f)
    summary.pop("config", None)
    summary["world_size"] = n
    return summary


def _local(cfg, field: str) -> bool:
    value = getattr(cfg, field, None)
    return value is not None and os.path.exists(value)


class _StepFollower:
    """Calls `on_step` with each row rank 0 appends to `path`, from a thread while the run goes
    on, and once more for the last rows when the run ends."""

    def __init__(self, path: str, on_step: Callable[[dict], None] | None) -> None:
        self.path, self.on_step = path, on_step
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="kiln-rl-steps")

    def __enter__(self) -> _StepFollower:
        if self.on_step is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.on_step is not None:
            self._stop.set()
            self._thread.join()

    def _follow(self) -> None:
        stopped = False
        while not stopped:
            stopped = self._stop.wait(0.5)  # once more after the stop: the last steps' rows
            self._read()

    def _read(self) -> None:
        if not os.path.isfile(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written: next time
        self._offset += len(complete)
        for line in complete.splitlines():
            self.on_step(json.loads(line))


# -- on each worker ----------------------------------------------------------------------------


def _rank_main(config: dict) -> None:
    """One rank: the objective's run function on the process group Ray Train started."""
    import ray.train
    import torch

    torch.set_num_threads(config["threads"])
    run, config_class = RUNS[config["objective"]]
    cfg = config_class.model_validate(config["cfg"])
    rank = ray.train.get_context().get_world_rank()
    steps = open(config["steps_file"], "a") if rank == 0 else None  # noqa: SIM115 - the run's

    def on_step(m: dict) -> None:
        steps.write(json.dumps(m, default=float) + "\n")
        steps.flush()

    try:
        run(cfg, config["out_dir"], on_step if rank == 0 else None, config["state_dir"])
    finally:
        if steps is not None:
            steps.close()
