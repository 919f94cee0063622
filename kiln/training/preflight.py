"""What the driver checks before any training worker starts.

Layout: the rules the trainer enforces on its workers (heads, layers, micro-batches and the
sequence divisible by the parallel degrees, the batch by data parallelism), checked on the
config alone, so a mistake is one line in a second instead of a worker traceback ~20 s later.
Resources: Ray Train waits forever for workers Ray cannot place, so the workers' CPUs and GPUs
are compared with what the cluster has, and `device: cuda` with the GPUs there are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.platform.errors import ConfigError
from kiln.platform.runtime import default_cpus_per_worker
from kiln.training.parallel.dims import ParallelDims
from kiln.training.parallel.pipeline_shape import pipeline_microbatches, virtual_stages
from kiln.training.precision import check_fp8_layout

if TYPE_CHECKING:
    from kiln.training.config import TrainConfig
    from kiln.training.parallel.dims import ParallelDims
    from kiln.training.ray_train import RayOptions


def launch_plan(
    cfg: TrainConfig,
    options: RayOptions,
    resources: tuple[float, float, str] | None,
    model_known: bool = True,
) -> tuple[int, bool, float]:
    """(workers, use_gpu, CPUs per worker) of `cfg` on Ray, after every check above.

    `resources`: (CPUs, GPUs, whose) the workers can have (None: not known yet, layout only);
    `model_known`: False when the model's shape comes later (a base model not read yet)."""

    try:
        dims = check_layout(cfg, options.num_workers, model_known)
    except ConfigError as exc:
        if options.num_workers is None:
            raise
        raise ConfigError(f"ray.num_workers={options.num_workers}: {exc}") from None
    workers = dims.world_size
    if resources is None:
        return workers, bool(options.use_gpu), options.cpus_per_worker or 1.0
    have_cpus, have_gpus, where = resources
    use_gpu = options.use_gpu if options.use_gpu is not None else have_gpus >= workers
    cpus = options.cpus_per_worker or default_cpus_per_worker(have_cpus)
    check_device(cfg, workers, use_gpu, have_gpus, where)
    if options.elastic is None:  # an elastic run sizes itself to what is there
        check_resources(workers, cpus, use_gpu, have_cpus, have_gpus, where)
    return workers, use_gpu, cpus


def check_layout(
    cfg: TrainConfig, num_workers: int | None = None, model_known: bool = True
) -> ParallelDims:
    """The layout of `cfg` on `num_workers` ranks (None: the fewest it runs on), or the
    ConfigError its workers would raise while building the model."""

    dims = ParallelDims.from_config(cfg.parallel, num_workers)
    cfg.grad_accum_steps(dims.dp_size)
    if cfg.precision == "fp8":
        check_fp8_layout(cfg)
    if cfg.parallel.cp > 1 and cfg.seq_len % (2 * cfg.parallel.cp):
        raise ConfigError(
            f"seq_len={cfg.seq_len} must be a multiple of 2*parallel.cp = {2 * cfg.parallel.cp} "
            "for context parallelism"
        )
    if model_known:
        _check_model_split(cfg)
    return dims


def _check_model_split(cfg: TrainConfig) -> None:
    """The model's heads, layers and experts divide over the parallel degrees."""

    p, m = cfg.parallel, cfg.model
    if m.n_heads % p.tp or m.n_kv_heads % p.tp:
        raise ConfigError(
            f"parallel.tp={p.tp} must divide model.n_heads ({m.n_heads}) "
            f"and n_kv_heads ({m.n_kv_heads})"
        )
    if p.pp > 1:
        stages = p.pp * virtual_stages(p)
        if m.n_layers < stages:
            raise ConfigError(
                f"parallel.pp={p.pp}: model.n_layers ({m.n_layers}) must be >= the number of "
                f"pipeline stages ({stages})"
            )
        if cfg.micro_batch_size % pipeline_microbatches(cfg):
            raise ConfigError(
                f"micro_batch_size ({cfg.micro_batch_size}) must be a multiple of "
                f"parallel.pp_microbatches ({pipeline_microbatches(cfg)})"
            )
    if p.ep > 1 and m.n_experts and m.n_experts % p.ep:
        raise ConfigError(f"model.n_experts={m.n_experts} must be a multiple of parallel.ep={p.ep}")


def check_resources(
    workers: int, cpus_each: float, use_gpu: bool, have_cpus: float, have_gpus: float, where: str
) -> None:
    """`workers` Ray Train workers fit in `have_cpus`/`have_gpus` (`where`: whose they are)."""
    need_cpus = workers * cpus_each
    if need_cpus > have_cpus + 1e-9:
        raise ConfigError(
            f"parallel: {workers} training workers need {need_cpus:g} CPUs ({cpus_each:g} each), "
            f"{where} has {have_cpus:g}: lower the parallel degrees (or ray.cpus_per_worker)"
        )
    if use_gpu and workers > have_gpus:
        raise ConfigError(
            f"parallel: {workers} training workers need one GPU each, {where} has {have_gpus:g}"
        )


def check_device(cfg: TrainConfig, workers: int, use_gpu: bool, have_gpus: float, where: str):
    """`device: cuda` runs only on workers that are given a GPU."""
    if cfg.device != "cuda" or use_gpu:
        return
    raise ConfigError(
        f"device=cuda but {where} has {have_gpus:g} GPU(s) for {workers} worker(s) "
        "(use device: auto or cpu, or run on a machine with GPUs)"
    )
