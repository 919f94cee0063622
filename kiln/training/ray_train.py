"""Training on Ray Train: a `TorchTrainer` whose workers each run the trainer core on one rank.

World size = pp x dp_replicate x dp_shard x cp x tp; gloo on CPU, NCCL on GPU. Rank 0 writes the
per-step metrics locally (JSONL + TensorBoard) and the trainer logs one progress line per logged
step. The step loop never waits on Ray Train: a reporter thread on each worker tells it about each
newly committed checkpoint (so its restore knows it) and the final metrics (`ray_report`). Ray
Train's own per-report log lines go to `<run_dir>/logs/`. DCP writes every rank's shard itself.

Fault tolerance: with `max_failures > 0`, Ray restarts the worker group after a worker dies and
the loop resumes from the newest complete checkpoint. With `elastic: {min_workers, max_workers}`
kiln restarts the run itself at the largest layout the remaining nodes hold (dp shrinks, see
`kiln.training.elastic`), grows back at a checkpoint once lost nodes return, and records each
change in the metrics and `layout_changes.jsonl`.
Resuming a stopped run = running again with the same `name` and `storage_path` (Ray Train V2
has no `resume_from_checkpoint`).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Runtime
from kiln.training.checkpoint import latest_checkpoint, read_sidecar
from kiln.training.checkpoint.resume import announce_resume
from kiln.training.elastic import (
    GROW_MARK,
    ElasticConfig,
    check_grow,
    plan_workers,
    read_layout_changes,
    record_layout_change,
    valid_worker_counts,
)
from kiln.training.launch import process_group_backend
from kiln.training.lean_trainer import LeanTorchTrainer
from kiln.training.metrics_log import METRICS_FILE, MetricsWriter, plot_loss_curve, read_metrics
from kiln.training.parallel.dims import ParallelDims
from kiln.training.preflight import launch_plan
from kiln.training.ray_report import POINTER_FILE, RayReporter, route_ray_train_log
from kiln.training.worker_errors import worker_error

log = logging.getLogger("kiln.train")
TRAINER, CONFIG = "kiln.training.trainer:Trainer", "kiln.training.config:TrainConfig"


class RayOptions(BaseModel):
    """How the training job is laid out on Ray."""

    model_config = ConfigDict(extra="forbid")

    num_workers: int | None = Field(
        None, ge=1, description="Default: the product of the parallel dims."
    )
    cpus_per_worker: float | None = Field(
        None, gt=0, description="Default: 0.5 on small machines, else 1."
    )
    use_gpu: bool | None = Field(None, description="Default: when Ray reports GPUs.")
    max_failures: int = Field(
        0, ge=-1, description="Worker-group restarts allowed (-1: unlimited)."
    )
    name: str = Field("kiln-train", description="Ray Train run name; the same name resumes.")
    storage_path: str | None = Field(
        None, description="Ray Train storage (default: <run_dir>/ray)."
    )
    elastic: ElasticConfig | None = Field(
        None, description="Continue on fewer workers (dp shrinks) when a node is lost."
    )
    callbacks: list[str] = Field(
        default_factory=list,
        description="'module:function' called on every worker after each step as "
        "fn(metrics, info).",
    )


def world_size(cfg, options: RayOptions) -> int:
    """Workers to start: `ray.num_workers`, or the fewest ranks the layout runs on."""

    try:
        return ParallelDims.from_config(cfg.parallel, options.num_workers).world_size
    except ConfigError as exc:
        if options.num_workers is None:
            raise
        raise ConfigError(f"ray.num_workers={options.num_workers}: {exc}") from exc


def train_on_ray(
    cfg, run_dir: str, options: RayOptions | None = None, runtime=None, trainer: str = TRAINER
) -> dict[str, Any]:
    """Run `cfg` (a TrainConfig) on Ray Train; returns a summary (metrics, checkpoint, paths).
    `trainer` ('module:Class', a Trainer subclass taking cfg's config class) runs on each worker."""

    options = options or RayOptions()
    runtime = runtime or Runtime()
    # refused here, in one line, rather than by every worker or by Ray waiting forever; first
    # before an embedded Ray starts (what this machine has), then against what Ray reports
    model_known = not getattr(cfg, "base", None)
    launch_plan(cfg, options, runtime.planned_resources(), model_known)
    runtime.ensure()
    os.makedirs(run_dir, exist_ok=True)
    storage_path = options.storage_path or os.path.join(os.path.abspath(run_dir), "ray")
    n, use_gpu, cpus = launch_plan(cfg, options, runtime.planned_resources(), model_known)
    if options.elastic:
        n = plan_workers(cfg, options.elastic, cpus, use_gpu)
    cfg = _with_checkpoint_dir(cfg, os.path.join(storage_path, options.name, "checkpoints"))
    resumed_from = announce_resume(cfg.checkpoint.dir)
    t0 = time.perf_counter()
    change = None
    for restart in range(options.elastic.max_restarts + 1 if options.elastic else 1):
        ray_trainer = _torch_trainer(  # not `trainer`: that is the class path, on every restart
            cfg,
            run_dir,
            options,
            storage_path,
            n,
            use_gpu,
            cpus,
            change,
            trainer_path=trainer,
            embedded=runtime.embedded,
        )
        log.info(
            "training on Ray: %d workers (%s, %.2g CPU each), run %r in %s",
            n,
            "GPU" if use_gpu else "CPU",
            cpus,
            options.name,
            storage_path,
        )
        try:
            result = ray_trainer.fit()
            break
        except ray_train_failure() as exc:
            if not options.elastic or restart == options.elastic.max_restarts:
                raise worker_error(exc, run_dir) from None
            change = _elastic_change(cfg, options, run_dir, n, cpus, use_gpu, exc)
            n = change["to_workers"]
    history = read_metrics(run_dir)
    plot = plot_loss_curve(history, os.path.join(run_dir, "loss.png")) if history else None

    return {
        "final": result.metrics,
        "checkpoint_root": cfg.checkpoint.dir,
        "checkpoint": latest_checkpoint(cfg.checkpoint.dir),
        "metrics_file": os.path.join(run_dir, METRICS_FILE),
        "loss_curve": plot,
        "wall_s": time.perf_counter() - t0,
        "world_size": n,
        "layout_changes": read_layout_changes(run_dir),
        "resumed_from_step": resumed_from,
    }


def _failure_reason(exc: Exception) -> str:
    """One line: the error type and the most telling line of Ray's report (a dead node first)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines if GROW_MARK in line]
    telling += [line for line in lines if "node" in line.lower() and "died" in line.lower()]
    detail = (telling or lines or [""])[0]
    return f"{type(exc).__name__}: {detail[:300]}"


def ray_train_failure() -> type[Exception]:
    from ray.train import TrainingFailedError

    return TrainingFailedError


def _elastic_change(cfg, options, run_dir, n, cpus, use_gpu, exc) -> dict[str, Any]:
    """Re-plan after a failed attempt: the new worker count and why, recorded in the run."""

    latest = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
    new_n = plan_workers(cfg, options.elastic, cpus, use_gpu)
    change = {
        "from_workers": n,
        "to_workers": new_n,
        "resume_step": read_sidecar(latest)["step"] if latest else 0,
        "reason": _failure_reason(exc),
    }
    record_layout_change(run_dir, change)
    return change


def _with_checkpoint_dir(cfg, default_dir: str):
    """Checkpoints under Ray's storage unless the config names a folder (restarts resume there)."""
    if cfg.checkpoint.dir:
        return cfg
    return cfg.model_copy(
        update={"checkpoint": cfg.checkpoint.model_copy(update={"dir": default_dir})}
    )


def _torch_trainer(
    cfg,
    run_dir: str,
    options: RayOptions,
    storage_path: str,
    n: int,
    use_gpu: bool,
    cpus: float,
    layout_change: dict | None = None,
    trainer_path: str = "",
    embedded: bool = False,
):
    """A TorchTrainer running `_train_loop` on n workers (gloo on CPU, NCCL on GPU)."""
    import ray.train
    from ray.train.torch import TorchConfig

    loop_config = {
        "train": cfg.model_dump(mode="json", by_alias=True),
        "run_dir": os.path.abspath(run_dir),
        "threads": max(1, int(cpus)),
        "callbacks": options.callbacks,
        "layout_change": layout_change,
        # below max_workers, rank 0 looks for returned nodes after each checkpoint
        "grow": {
            "running": n,
            "counts": valid_worker_counts(cfg, options.elastic),
            "cpus": cpus,
            "use_gpu": use_gpu,
        }
        if options.elastic
        else None,
        "trainer": trainer_path or TRAINER,
        "config_class": f"{type(cfg).__module__}:{type(cfg).__name__}",
    }
    return LeanTorchTrainer(
        _train_loop,
        embedded=embedded,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=process_group_backend(use_gpu, cfg.optimizer_offload)),
        scaling_config=ray.train.ScalingConfig(
            num_workers=n,
            use_gpu=use_gpu,
            resources_per_worker={"GPU": 1, "CPU": cpus} if use_gpu else {"CPU": cpus},
        ),
        run_config=ray.train.RunConfig(
            name=options.name,
            storage_path=storage_path,
            # elastic runs restart in kiln (at a new size), so a failure ends Ray's attempt
            failure_config=ray.train.FailureConfig(
                max_failures=0 if options.elastic else options.max_failures
            ),
            # Ray keeps as many checkpoint pointers as kiln keeps checkpoints (ray_report)
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
        ),
    )


# -- on each worker ----------------------------------------------------------------------------


def _train_loop(config: dict) -> None:
    import ray.train
    import torch

    torch.set_num_threads(config["threads"])
    Trainer = _import(config.get("trainer", TRAINER))  # noqa: N806 - a class
    cfg = _import(config.get("config_class", CONFIG)).model_validate(config["train"])
    resume = _resume_point(cfg.checkpoint.dir, ray.train.get_checkpoint())
    if resume:
        cfg = cfg.model_copy(
            update={"checkpoint": cfg.checkpoint.model_copy(update={"load_from": resume})}
        )
    context = ray.train.get_context()
    rank = context.get_world_rank()
    _worker_logging(rank, config["run_dir"])
    callbacks = [_import(path) for path in config["callbacks"]]
    writer = MetricsWriter(config["run_dir"]) if rank == 0 else None

    layout_note = config.get("layout_change")

    def on_step(metrics: dict[str, Any]) -> None:
        nonlocal layout_note
        if rank == 0:
            check_grow(config.get("grow"), metrics["step"], committed())
        metrics = {
            **metrics,
            "world_size": trainer.dims.world_size,
            "dp_size": trainer.dims.dp_size,
            "grad_accum": trainer.grad_accum,
        }
        if layout_note:  # the first step after an elastic restart says when and why
            metrics["layout_change"] = layout_note
            layout_note = None
        if writer:
            writer.write(metrics)
        for fn in callbacks:
            fn(metrics, {"rank": rank, "run_dir": config["run_dir"], "resumed_from": resume})
        reporter.update(metrics)  # no call into Ray: the reporter's thread reports

    trainer = Trainer(cfg, on_step=on_step)  # builds its checkpointer in train()

    def committed() -> tuple[int, str] | None:
        return trainer.checkpointer.committed if trainer.checkpointer is not None else None

    reporter = RayReporter(rank, context.get_world_size(), committed)
    try:
        history = trainer.train()
        reporter.finish(history[-1] if history else {"step": trainer.step})
    finally:
        if writer:
            writer.close()


def _worker_logging(rank: int, run_dir: str) -> None:
    """Ray workers log at WARNING by default: show rank 0's progress lines (forwarded to the
    driver), and send Ray Train's line per report to a file in the run folder."""
    route_ray_train_log(run_dir, rank)
    kiln_log = logging.getLogger("kiln")
    if not kiln_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        kiln_log.addHandler(handler)
        kiln_log.propagate = False
    kiln_log.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _resume_point(ckpt_root: str | None, ray_checkpoint) -> str | None:
    """The newer of Ray's latest reported checkpoint and the `latest` pointer in the root."""

    candidates = []
    if ray_checkpoint is not None:
        pointer = os.path.join(ray_checkpoint.path, POINTER_FILE)
        if os.path.exists(pointer):
            with open(pointer) as f:
                candidates.append(json.load(f)["uri"])
        else:
            candidates.append(ray_checkpoint.path)
    if ckpt_root and (latest := latest_checkpoint(ckpt_root)):
        candidates.append(latest)
    steps = []
    for c in candidates:
        try:
            steps.append((read_sidecar(c)["step"], c))
        except Exception as e:  # noqa: BLE001 - a pruned or unreadable one is simply not a candidate
            log.warning("not resuming from %s: %s", c, e)
    return max(steps)[1] if steps else None


def _import(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
