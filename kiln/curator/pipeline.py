"""`curate()`: the whole curation run — stream (Ray Data), dedup (Dask), output, report."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import time
from collections import Counter

from kiln.curator.config import CurateConfig
from kiln.curator.dedup.engine import dask_session, resolve_backend
from kiln.curator.dedup.run import run_dedup
from kiln.curator.filters import DocumentFilter, build_filters
from kiln.curator.output import write_outputs
from kiln.curator.readers import expand_inputs, plan_tasks
from kiln.curator.report import build_report, plot_funnel, write_report
from kiln.curator.stream import run_stream
from kiln.platform.errors import InputError

log = logging.getLogger("kiln.curator")


def _ray_runtime(cfg: CurateConfig, runtime):
    """Ray is needed for Ray Data streaming and for Dask-on-Ray; attach or start it."""
    if cfg.stream != "ray" and cfg.cluster != "ray":
        return None, None
    import ray

    if runtime is not None:
        runtime.ensure()
        return runtime, None
    if ray.is_initialized():
        from kiln.platform.runtime import Runtime

        return Runtime(), None
    from kiln.platform.runtime import Runtime

    rt = Runtime().ensure()
    return rt, rt  # the second one is shut down at the end


def curate(
    cfg: CurateConfig, output_dir: str, extra_filters: list[DocumentFilter] = (), runtime=None
) -> dict:
    """Curate `cfg.input` into `output_dir` (shards, rejected/, report.json, funnel.png)."""
    t0 = time.perf_counter()
    files = expand_inputs(cfg.input)
    tasks = plan_tasks(files, cfg.read.split_bytes, cfg.read.text_files_per_task)
    backend = resolve_backend(cfg.backend, cfg.cluster)
    if backend != cfg.backend:  # actors see the resolved backend (GPU MinHash under cudf)
        cfg = cfg.model_copy(update={"backend": backend})
    os.makedirs(output_dir, exist_ok=True)
    if glob.glob(os.path.join(output_dir, "shard-*.parquet")):
        raise InputError(
            f"{output_dir}: already holds curated shards (expected an empty output folder)"
        )
    rejected_dir = os.path.join(output_dir, "rejected")
    work_dir = os.path.join(output_dir, "_work")
    for d in (rejected_dir, work_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.join(d, "stream") if d == work_dir else d)
    rt, started = _ray_runtime(cfg, runtime)
    seconds = {}
    try:
        cpus = rt.cpus_per_worker() if rt else 0.5
        log.info("curating %d files in %d tasks", len(files), len(tasks))
        stats = run_stream(
            tasks, cfg, os.path.join(work_dir, "stream"), rejected_dir, extra_filters, cpus
        )
        seconds["stream"] = time.perf_counter() - t0
        if started is not None and cfg.cluster != "ray":
            # Dedup on Dask threads needs no Ray: give the memory of Ray's processes
            # (~0.6 GB on a small machine) to the dedup shuffle.
            started.shutdown()
            started = None
        staging = sorted(glob.glob(os.path.join(work_dir, "stream", "*.parquet")))
        t1 = time.perf_counter()
        with dask_session(
            backend,
            cfg.cluster,
            cfg.rmm_async,
            cfg.rmm_release_threshold,
            spill_dir=os.path.join(work_dir, "dask"),
        ):
            n_candidates = sum(s["in"] - sum(s["reasons"].values()) for s in stats)
            dedup = run_dedup(staging, cfg, backend, n_candidates)
        seconds["dedup"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        kept = write_outputs(
            staging,
            dedup.exact_rows,
            dedup.fuzzy_rows,
            output_dir,
            rejected_dir,
            os.path.join(work_dir, "spill"),
            cfg.output,
        )
        seconds["output"] = time.perf_counter() - t2
    finally:
        if started is not None:
            started.shutdown()
    shutil.rmtree(work_dir, ignore_errors=True)
    seconds["total"] = time.perf_counter() - t0
    reasons = sum((Counter(s["reasons"]) for s in stats), Counter())
    n_in = sum(s["in"] for s in stats)
    names = [f.name for f in build_filters(cfg.filters, list(extra_filters))]
    report = build_report(n_in, reasons, names, dedup.counts, kept, seconds)
    report["backend"], report["cluster"], report["stream"] = backend, cfg.cluster, cfg.stream
    report["docs_per_s"] = n_in / seconds["total"] if seconds["total"] else 0.0
    write_report(report, os.path.join(output_dir, "report.json"))
    if cfg.output.plot:
        plot_funnel(report, os.path.join(output_dir, "funnel.png"))
    if not report["invariant_holds"]:
        raise RuntimeError(
            f"curation lost documents: {n_in} in, {kept} kept, {report['rejected']} rejected"
        )
    log.info(
        "curated %d documents: %d kept, %d rejected (%.1f s)",
        n_in,
        kept,
        n_in - kept,
        seconds["total"],
    )
    return report
