"""The streamed per-document stage: read tasks run on Ray Data actors (or inline), each batch is
processed and written straight to Parquet, so memory stays bounded by one batch per actor.

A task's files are written first and its counts recorded in the stream folder's ledger last, so
a killed run's next attempt runs only the unrecorded tasks (`run_stream(..., finished=...)`)."""

from __future__ import annotations

import json
import os
from collections import Counter
from itertools import islice

import numpy as np
import pyarrow.parquet as pq

from kiln.curator.config import CurateConfig
from kiln.curator.ledger import Ledger
from kiln.curator.process import ChunkProcessor
from kiln.curator.readers import ReadTask, read_task


def run_task(task: ReadTask, proc: ChunkProcessor, work_dir: str, rejected_dir: str) -> dict:
    """Read, process and write one task, then record it in `work_dir`'s ledger; returns its
    counts (documents in, reasons)."""
    cfg = proc.cfg
    records = read_task(task, cfg.read)
    n_in, reasons, chunk, ordinal = 0, Counter(), 0, 0
    while True:
        batch = list(islice(records, cfg.read.chunk_docs))
        if not batch:
            break
        rows = (np.int64(task.index) << np.int64(32)) + np.arange(
            ordinal, ordinal + len(batch), dtype=np.int64
        )
        kept, rejected, counts = proc.process(batch, rows)
        name = f"part-{task.index:05d}-{chunk:04d}.parquet"
        if kept.num_rows:
            pq.write_table(kept, os.path.join(work_dir, name), compression="zstd")
        if rejected.num_rows:
            pq.write_table(
                rejected,
                os.path.join(rejected_dir, f"stream-{name}"),
                compression=cfg.output.compression,
            )
        n_in += len(batch)
        reasons += counts
        ordinal += len(batch)
        chunk += 1
    pii = proc.take_pii_counts().to_dict()
    counts = {"task": task.index, "in": n_in, "reasons": dict(reasons), "pii": pii}
    Ledger(work_dir).record(task.index, counts)
    return counts


def clear_unfinished(tasks: list[ReadTask], work_dir: str, rejected_dir: str) -> None:
    """Remove what killed attempts of `tasks` left (some of their chunks): they run again."""
    for task in tasks:
        prefix = f"part-{task.index:05d}-"
        for folder, head in ((work_dir, prefix), (rejected_dir, f"stream-{prefix}")):
            for name in os.listdir(folder):
                if name.startswith(head):
                    os.remove(os.path.join(folder, name))


class TaskActor:
    """A Ray Data actor: builds the filters (and loads the language model) once."""

    def __init__(self, cfg_json: str, work_dir: str, rejected_dir: str, extra_filters=()):
        self.proc = ChunkProcessor(CurateConfig.model_validate_json(cfg_json), list(extra_filters))
        self.work_dir, self.rejected_dir = work_dir, rejected_dir

    def __call__(self, batch: dict) -> dict:
        out = [
            run_task(ReadTask.from_dict(json.loads(t)), self.proc, self.work_dir, self.rejected_dir)
            for t in batch["task"]
        ]
        return {"stats": [json.dumps(s) for s in out]}


def run_stream(
    tasks: list[ReadTask],
    cfg: CurateConfig,
    work_dir: str,
    rejected_dir: str,
    extra_filters=(),
    cpus_per_actor: float = 0.5,
    on_task=None,
) -> list[dict]:
    """Every task's counts, sorted by task; `on_task(counts)` as each one finishes (progress)."""
    if not tasks:
        return []
    done = on_task or (lambda _counts: None)
    if cfg.stream == "inline":
        proc = ChunkProcessor(cfg, list(extra_filters))
        stats = []
        for t in tasks:
            stats.append(run_task(t, proc, work_dir, rejected_dir))
            done(stats[-1])
        return stats
    import ray

    actors = max(1, min(len(tasks), cfg.actors or os.cpu_count() or 1))
    # An actor that dies while starting (its node lost, or a pending one Ray Data itself let go)
    # is replaced, up to once per actor in a row; a constructor that always fails still fails
    # the run. Ray Data's default (0) fails the whole curate on the first such death.
    data_ctx = ray.data.DataContext.get_current()
    if 0 <= data_ctx.max_consecutive_actor_init_deaths < actors:
        data_ctx.max_consecutive_actor_init_deaths = actors
    ds = ray.data.from_items(
        [{"task": json.dumps(t.to_dict())} for t in tasks], override_num_blocks=len(tasks)
    )
    ds = ds.map_batches(
        TaskActor,
        fn_constructor_args=(cfg.model_dump_json(), work_dir, rejected_dir, list(extra_filters)),
        batch_size=1,
        # one task at a time per actor: a task is a whole file chunk, and an actor holding
        # several queued (Ray Data's default 4) leaves the others idle at the end of a run
        compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
        num_cpus=cpus_per_actor,
        num_gpus=1.0 / actors if cfg.backend == "cudf" else 0,
    )
    stats = []
    for row in ds.iter_rows():  # as the actors finish tasks, not all at the end
        stats.append(json.loads(row["stats"]))
        done(stats[-1])
    return sorted(stats, key=lambda s: s["task"])
