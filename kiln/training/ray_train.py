"""Training on Ray Train: a `TorchTrainer` whose workers each run the trainer core on one rank.

World size = pp x dp_replicate x dp_shard x cp x tp; gloo on CPU, NCCL on GPU. Rank 0 writes the
per-step metrics (JSONL + TensorBoard) and logs progress with an ETA; every rank calls
`ray.train.report` (a barrier) and rank 0 attaches each newly committed checkpoint, so Ray Train's
own restore knows it. DCP writes every rank's shard itself.

Fault tolerance: with `max_failures > 0`, Ray restarts the worker group after a worker dies and
the loop resumes from the newest complete checkpoint. Resuming a stopped run = running again
with the same `name` and `storage_path` (Ray Train V2 has no `resume_from_checkpoint`).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import tempfile
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.errors import ConfigError

log = logging.getLogger("kiln.train")

METRICS_FILE = "metrics.jsonl"
POINTER_FILE = "kiln_checkpoint.json"


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
    callbacks: list[str] = Field(
        default_factory=list,
        description="'module:function' called on every worker after each step as fn(metrics, info).",
    )


def world_size(cfg, options: RayOptions) -> int:
    p = cfg.parallel
    others = p.pp * p.dp_replicate * p.cp * p.tp
    size = others * (p.dp_shard if p.dp_shard > 0 else 1)
    if options.num_workers is not None:
        if p.dp_shard > 0 and options.num_workers != size:
            raise ConfigError(
                f"ray.num_workers={options.num_workers} but the parallel dims multiply to {size}"
            )
        size = options.num_workers
    return size


def train_on_ray(
    cfg, run_dir: str, options: RayOptions | None = None, runtime=None
) -> dict[str, Any]:
    """Run `cfg` (a TrainConfig) on Ray Train; returns a summary (final metrics, checkpoint, paths)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from kiln.platform.runtime import Runtime

    options = options or RayOptions()
    runtime = (runtime or Runtime()).ensure()
    os.makedirs(run_dir, exist_ok=True)
    storage_path = options.storage_path or os.path.join(os.path.abspath(run_dir), "ray")
    n = world_size(cfg, options)
    use_gpu = options.use_gpu if options.use_gpu is not None else runtime.gpus >= n
    cpus = options.cpus_per_worker or runtime.cpus_per_worker()
    if not cfg.checkpoint.dir:
        cfg = cfg.model_copy(
            update={
                "checkpoint": cfg.checkpoint.model_copy(
                    update={"dir": os.path.join(storage_path, options.name, "checkpoints")}
                )
            }
        )
    loop_config = {
        "train": cfg.model_dump(mode="json", by_alias=True),
        "run_dir": os.path.abspath(run_dir),
        "threads": max(1, int(cpus)),
        "callbacks": options.callbacks,
    }
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=n,
            use_gpu=use_gpu,
            resources_per_worker={"GPU": 1, "CPU": cpus} if use_gpu else {"CPU": cpus},
        ),
        run_config=ray.train.RunConfig(
            name=options.name,
            storage_path=storage_path,
            failure_config=ray.train.FailureConfig(max_failures=options.max_failures),
        ),
    )
    log.info(
        "training on Ray: %d workers (%s, %.2g CPU each), run %r in %s",
        n,
        "GPU" if use_gpu else "CPU",
        cpus,
        options.name,
        storage_path,
    )
    t0 = time.perf_counter()
    result = trainer.fit()
    history = read_metrics(run_dir)
    plot = plot_loss_curve(history, os.path.join(run_dir, "loss.png")) if history else None
    from kiln.training.checkpoint import latest_checkpoint

    return {
        "final": result.metrics,
        "checkpoint_root": cfg.checkpoint.dir,
        "checkpoint": latest_checkpoint(cfg.checkpoint.dir),
        "metrics_file": os.path.join(run_dir, METRICS_FILE),
        "loss_curve": plot,
        "wall_s": time.perf_counter() - t0,
        "world_size": n,
    }


# -- on each worker ----------------------------------------------------------------------------


def _train_loop(config: dict) -> None:
    import ray.train
    import torch

    from kiln.training.config import TrainConfig
    from kiln.training.trainer import Trainer

    torch.set_num_threads(config["threads"])
    cfg = TrainConfig.model_validate(config["train"])
    resume = _resume_point(cfg.checkpoint.dir, ray.train.get_checkpoint())
    if resume:
        cfg = cfg.model_copy(
            update={"checkpoint": cfg.checkpoint.model_copy(update={"load_from": resume})}
        )
    rank = ray.train.get_context().get_world_rank()
    _worker_logging(rank)
    callbacks = [_import(path) for path in config["callbacks"]]
    logger = StepLogger(config["run_dir"], cfg.steps, cfg.log_every) if rank == 0 else None
    reporter = _Reporter(rank)
    holder: dict[str, Any] = {}

    def on_step(metrics: dict[str, Any]) -> None:
        if logger:
            logger.log(metrics)
        for fn in callbacks:
            fn(metrics, {"rank": rank, "run_dir": config["run_dir"], "resumed_from": resume})
        if metrics["step"] % cfg.log_every == 0:  # the same rule on every rank: report is a barrier
            reporter.report(metrics, getattr(holder["trainer"], "checkpointer", None))

    trainer = holder["trainer"] = Trainer(cfg, on_step=on_step)
    try:
        history = trainer.train()
        last = history[-1] if history else {"step": getattr(trainer, "step", 0)}
        reporter.report(last, getattr(trainer, "checkpointer", None), final=True)
    finally:
        if logger:
            logger.close()


def _worker_logging(rank: int) -> None:
    """Ray workers log at WARNING by default: show rank 0's progress lines (forwarded to the driver)."""
    kiln_log = logging.getLogger("kiln")
    if not kiln_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        kiln_log.addHandler(handler)
        kiln_log.propagate = False
    kiln_log.setLevel(logging.INFO if rank == 0 else logging.WARNING)


class _Reporter:
    """Calls `ray.train.report` on every rank; rank 0 attaches each newly committed checkpoint."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.reported: str | None = None

    def report(self, metrics: dict[str, Any], checkpointer, final: bool = False) -> None:
        import ray.train

        committed = getattr(checkpointer, "committed", None)
        checkpoint, mode = None, ray.train.CheckpointUploadMode.NO_UPLOAD
        with tempfile.TemporaryDirectory() as tmp:
            if self.rank == 0 and committed and committed[1] != self.reported:
                checkpoint, mode = _ray_checkpoint(committed[1], tmp)
                self.reported = committed[1]
            clean = {
                k: v
                for k, v in metrics.items()
                if isinstance(v, int | float | str | bool) or v is None
            }
            ray.train.report(
                {**clean, "final": final}, checkpoint=checkpoint, checkpoint_upload_mode=mode
            )


def _ray_checkpoint(ckpt_dir: str, tmp: str):
    """The DCP folder itself when it lives in Ray's storage; else a small pointer checkpoint."""
    import ray.train
    from ray.train.v2._internal.execution.context import get_train_context

    storage = get_train_context().get_storage()
    if os.path.abspath(ckpt_dir).startswith(os.path.abspath(storage.experiment_fs_path) + os.sep):
        return ray.train.Checkpoint(ckpt_dir), ray.train.CheckpointUploadMode.NO_UPLOAD
    with open(os.path.join(tmp, POINTER_FILE), "w") as f:
        json.dump({"uri": ckpt_dir}, f)
    return ray.train.Checkpoint.from_directory(tmp), ray.train.CheckpointUploadMode.SYNC


def _resume_point(ckpt_root: str | None, ray_checkpoint) -> str | None:
    """The newer of Ray's latest reported checkpoint and the `latest` pointer in the root."""
    from kiln.training.checkpoint import latest_checkpoint, read_sidecar

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


# -- observability -----------------------------------------------------------------------------


class StepLogger:
    """Rank 0: one JSON line and TensorBoard scalars per step, progress with an ETA in the log."""

    def __init__(self, run_dir: str, total_steps: int, log_every: int = 1) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(run_dir, exist_ok=True)
        self.total, self.log_every = total_steps, log_every
        self.jsonl = open(os.path.join(run_dir, METRICS_FILE), "a")  # noqa: SIM115 - open for the run
        self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        self.t0, self.first_step = time.monotonic(), None

    def log(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        self.jsonl.write(json.dumps({**metrics, "time": time.time()}, default=float) + "\n")
        self.jsonl.flush()
        for k, v in metrics.items():
            if k != "step" and isinstance(v, int | float):
                self.tb.add_scalar(f"train/{k}", v, step)
        if self.first_step is None:
            self.first_step, self.t0 = step, time.monotonic()
        if step % self.log_every == 0 or step == self.total:
            done = step - self.first_step
            eta = (
                (time.monotonic() - self.t0) / done * (self.total - step) if done else float("nan")
            )
            log.info(
                "step %d/%d loss %.4f lr %.3g %.0f tok/s ETA %s",
                step,
                self.total,
                metrics.get("loss", float("nan")),
                metrics.get("lr", float("nan")),
                metrics.get("tokens_per_s", 0.0),
                _hms(eta),
            )

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()


def _hms(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """Per-step metrics; after a restart the re-run steps replace the first attempt's."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    by_step: dict[int, dict] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def plot_loss_curve(history: list[dict[str, Any]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] for h in history], [h.get("loss") for h in history], lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
