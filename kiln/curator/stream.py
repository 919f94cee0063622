"""The streamed per-document stage: read tasks run on Ray actors (or inline), each batch is
processed and written straight to Parquet, so memory stays bounded by one batch per actor.

A task's files are written first and its counts recorded in the stream folder's ledger last, so
a killed run's next attempt runs only the unrecorded tasks (`run_stream(..., finished=...)`)."""

from __future__ import annotations

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
    """One streaming actor: builds the filters (and loads the language model) once, then runs
    the read tasks it is given, one at a time."""

    def __init__(self, cfg_json: str, work_dir: str, rejected_dir: str, extra_filters=()):
        self.proc = ChunkProcessor(CurateConfig.model_validate_json(cfg_json), list(extra_filters))
        self.work_dir, self.rejected_dir = work_dir, rejected_dir

    def run(self, task: dict) -> dict:
        return run_task(ReadTask.from_dict(task), self.proc, self.work_dir, self.rejected_dir)


# A task whose worker dies (killed, out of memory, its node lost) reruns on the restarted actor,
# this many times, before the actor counts as dead.
TASK_RETRIES = 3


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
    return run_on_actors(tasks, cfg, work_dir, rejected_dir, extra_filters, cpus_per_actor, done)


def run_on_actors(tasks, cfg, work_dir, rejected_dir, extra_filters, cpus_per_actor, done):
    """The tasks on a pool of Ray actors, one task in flight per actor (a task is a whole file
    chunk: an actor holding several queued leaves the others idle at the end of a run).

    Plain Ray actors rather than a Ray Data `map_batches`: the tasks are a short list and each
    actor writes its own output, so Ray Data's executor and its helper actors (stats, actor
    locations, autoscaling; a Python process each) were most of a small run's fixed cost. Ray
    Core restarts an actor whose worker dies and reruns its task (`TASK_RETRIES`); an actor that
    dies for good (in its constructor, or past its restarts) is replaced and its task given to
    the new one, up to once per actor in a row (a constructor that always fails fails the run)."""
    import ray
    from ray.exceptions import RayActorError

    n_actors = max(1, min(len(tasks), cfg.actors or os.cpu_count() or 1))
    actor_cls = ray.remote(
        num_cpus=cpus_per_actor,
        num_gpus=1.0 / n_actors if cfg.backend == "cudf" else 0,
        max_restarts=TASK_RETRIES,
        max_task_retries=TASK_RETRIES,
    )(TaskActor)
    args = (cfg.model_dump_json(), work_dir, rejected_dir, list(extra_filters))
    todo = [t.to_dict() for t in reversed(tasks)]  # popped from the end: in task order
    running: dict = {}  # object ref -> (actor, task)
    actors = []
    deaths = 0  # actors lost in a row, without a task finished in between

    def give(actor, task: dict) -> None:
        running[actor.run.remote(task)] = (actor, task)

    try:
        for _ in range(n_actors):
            actors.append(actor_cls.remote(*args))
            give(actors[-1], todo.pop())
        stats = []
        while running:
            [ref], _ = ray.wait(list(running), num_returns=1)
            actor, task = running.pop(ref)
            try:
                counts = ray.get(ref)
            except RayActorError:
                deaths += 1
                if deaths > n_actors:
                    raise
                ray.kill(actor, no_restart=True)
                actors.remove(actor)
                actors.append(actor_cls.remote(*args))
                give(actors[-1], task)
                continue
            deaths = 0
            stats.append(counts)
            done(counts)
            if todo:
                give(actor, todo.pop())
    finally:
        for actor in actors:  # their CPUs (and memory) go back before dedup
            ray.kill(actor, no_restart=True)
    return sorted(stats, key=lambda s: s["task"])
