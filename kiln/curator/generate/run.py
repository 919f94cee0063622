"""`generate()`: read rows, cut them into batches, run the batches not yet recorded in the work
folder (Ray Data actors with one engine each, or one engine inline), then write the Corpus:
shards in row order, `rejected/` with each failed row's reason, `report.json`.

A killed run leaves its finished batches recorded; the next run with the same config and inputs
generates only the others, and its output is byte-identical to an uninterrupted run's (greedy
decoding, or sampling with a seed: each row's seed is derived from its id)."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.curator.generate.config import GenerateConfig
from kiln.curator.generate.rows import files_signature, input_files, read_rows
from kiln.curator.generate.worker import GenerateActor, RowGenerator, batch_paths, run_batch
from kiln.curator.ledger import Ledger
from kiln.curator.report import write_report
from kiln.platform.errors import ConfigError, InputError
from kiln.platform.progress import Progress
from kiln.platform.runtime import Resources, Runtime

log = logging.getLogger("kiln.curator.generate")


def stream_needs(cfg: GenerateConfig) -> Resources:
    return Resources(ray=cfg.stream == "ray")


def _run_batches(cfg, todo, batches, work_dir, on_batch) -> None:
    """Every batch in `todo`, inline or on a Ray Data actor pool; `on_batch(counts)` as each
    finishes."""
    if cfg.stream == "inline":
        worker = RowGenerator(cfg)
        for i in todo:
            on_batch(run_batch(worker, i, batches[i], work_dir))
        return
    import ray

    actors = max(1, min(cfg.actors, len(todo)))
    items = [{"batch": i, "rows": json.dumps(batches[i], default=str)} for i in todo]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(
        GenerateActor,
        fn_constructor_args=(cfg.model_dump_json(), work_dir),
        batch_size=1,
        # a batch is seconds of decoding: an actor holding several queued leaves others idle
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
        num_cpus=cfg.cpus_per_actor,
    )
    for row in ds.iter_rows():  # as the actors finish batches
        on_batch(json.loads(row["stats"]))


def _concat(paths: list[str]) -> pa.Table | None:
    tables = [pq.read_table(p) for p in paths if os.path.exists(p)]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _write_corpus(cfg: GenerateConfig, n_batches: int, work_dir: str, output_dir: str) -> None:
    """Shards of `shard_rows` in row order; failed rows in rejected/, with their reason."""
    paths = [batch_paths(work_dir, i) for i in range(n_batches)]
    kept = _concat([p for p, _ in paths])
    if kept is not None:
        if "source" not in kept.column_names:
            kept = kept.append_column("source", pa.array(["generate"] * kept.num_rows))
        for s, start in enumerate(range(0, kept.num_rows, cfg.shard_rows)):
            shard = kept.slice(start, cfg.shard_rows)
            path = os.path.join(output_dir, f"shard-{s:05d}.parquet")
            pq.write_table(shard, path, compression="zstd")
    failed = _concat([f for _, f in paths])
    if failed is not None:
        path = os.path.join(output_dir, "rejected", "part-00000.parquet")
        pq.write_table(failed, path, compression="zstd")


def _plan(cfg: GenerateConfig, files: list[str], n_rows: int) -> dict:
    return {"config": cfg.model_dump(mode="json"), "files": files_signature(files), "rows": n_rows}


def generate(
    cfg: GenerateConfig,
    output_dir: str,
    work_dir: str | None = None,
    runtime: Runtime | None = None,
) -> dict:
    """Generate over `cfg.input` into `output_dir`; resumable through `work_dir` (default:
    `<output_dir>/_work`, kept until the run finishes). Returns the report."""
    t0 = time.perf_counter()
    if not cfg.model:
        raise ConfigError("generate.model: expected a model folder, .gguf or package name")
    if not cfg.input:
        raise ConfigError("generate.input: expected JSONL or Parquet files (or a Corpus)")
    files = input_files(cfg.input)
    rows = read_rows(files)
    batches = [rows[i : i + cfg.batch_rows] for i in range(0, len(rows), cfg.batch_rows)]
    if glob.glob(os.path.join(output_dir, "shard-*.parquet")):
        raise InputError(f"{output_dir}: already holds shards (expected an empty output folder)")
    work_dir = work_dir or os.path.join(output_dir, "_work")
    ledger = Ledger.open(work_dir, _plan(cfg, files, len(rows)))
    os.makedirs(os.path.join(work_dir, "batches"), exist_ok=True)
    shutil.rmtree(os.path.join(output_dir, "rejected"), ignore_errors=True)
    os.makedirs(os.path.join(output_dir, "rejected"))
    resumed = set(ledger.finished())
    todo = [i for i in range(len(batches)) if i not in resumed]
    log.info(
        "generate: %d rows in %d batches (%d already done)", len(rows), len(batches), len(resumed)
    )
    t1 = time.perf_counter()
    own = runtime is None and cfg.stream == "ray"
    runtime = runtime or (Runtime() if own else None)
    try:
        if runtime is not None:
            runtime.provide(stream_needs(cfg), "generate")
        with Progress(sum(len(batches[i]) for i in todo), "generate", unit="rows") as progress:
            _run_batches(cfg, todo, batches, work_dir, lambda c: progress.advance(c["rows"]))
    finally:
        if own:
            runtime.shutdown()
    seconds = time.perf_counter() - t1
    _write_corpus(cfg, len(batches), work_dir, output_dir)
    report = _report(cfg, ledger.finished(), len(rows), todo, resumed, seconds, t0)
    write_report(report, os.path.join(output_dir, "report.json"))
    if work_dir == os.path.join(output_dir, "_work"):
        shutil.rmtree(work_dir, ignore_errors=True)
    log.info(
        "generated %d rows (%d failed) in %.1f s",
        report["kept"],
        report["rejected"],
        report["seconds"]["total"],
    )
    return report


def _report(cfg, counts, n_rows, todo, resumed, seconds, t0) -> dict:
    """Counts over every batch (resumed ones too); throughput over the batches run now."""
    reasons: dict[str, int] = {}
    for c in counts.values():
        for reason, k in c["failed"].items():
            reasons[reason] = reasons.get(reason, 0) + k
    now = [counts[i] for i in todo]
    rows_now = sum(c["rows"] for c in now)
    tokens_now = sum(c["completion_tokens"] for c in now)
    kept = sum(c["generated"] for c in counts.values())
    return {
        "documents_in": n_rows,
        "generations_requested": n_rows * cfg.n,
        "kept": kept,
        "rejected": sum(reasons.values()),
        "removed_by_reason": reasons,
        "invariant_holds": kept + sum(reasons.values()) == n_rows * cfg.n,
        "prompt_tokens": sum(c["prompt_tokens"] for c in counts.values()),
        "completion_tokens": sum(c["completion_tokens"] for c in counts.values()),
        "batches": {"total": len(counts), "resumed": len(resumed), "processed": len(todo)},
        "rows_processed": rows_now,
        "rows_per_s": rows_now / seconds if seconds else 0.0,
        # decoding alone, summed over the workers (the rest of `seconds`: start-up, model loads)
        "engine_seconds": sum(c["seconds"] for c in now),
        "tokens_per_s": tokens_now / seconds if seconds else 0.0,
        "stream": cfg.stream,
        "actors": cfg.actors if cfg.stream == "ray" else 1,
        "model": cfg.model,
        "seconds": {"generate": seconds, "total": time.perf_counter() - t0},
    }
