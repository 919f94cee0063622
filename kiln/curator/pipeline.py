"""A curation run in two steps — stream (Ray or inline), then dedup (Dask), output and report.

Each step declares what it needs from the runtime (`Curation.steps`), so the platform can start
Ray for streaming and shut an embedded Ray down before dedup on Dask threads (its processes'
~0.6 GB go to the dedup shuffle). `curate()` runs both steps in one call; the `curate` pipeline
stage hands them to the platform.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from kiln.curator.config import CurateConfig
from kiln.curator.dedup.engine import dask_session, resolve_backend
from kiln.curator.dedup.run import run_dedup
from kiln.curator.dedup.span_step import cut_repeats
from kiln.curator.filters import DocumentFilter, build_filters
from kiln.curator.filters.japanese import require_segmenter
from kiln.curator.ledger import Ledger
from kiln.curator.output import write_outputs
from kiln.curator.pii import PiiCounts
from kiln.curator.readers import expand_inputs, plan_tasks
from kiln.curator.readers.base import ReadTask
from kiln.curator.report import build_report, plot_funnel, write_report
from kiln.curator.stream import clear_unfinished, run_stream
from kiln.platform.console import Progress
from kiln.platform.errors import InputError
from kiln.platform.runtime import Resources, Runtime

log = logging.getLogger("kiln.curator")


def step_needs(cfg: CurateConfig) -> tuple[Resources, Resources]:
    """What the stream and the dedup step need: Ray for its actors or Dask-on-Ray, else none
    (an inline stream before Dask-on-Ray leaves the runtime as it is: no stop and restart).
    Dedup on Dask threads takes an embedded Ray's memory even when a later stage needs Ray: the
    dedup peak and Ray's idle processes together can exceed a small machine's memory
    (docs/curator.md)."""
    on_ray = cfg.cluster == "ray"
    stream = True if cfg.stream == "ray" else (None if on_ray else False)
    return Resources(ray=stream), Resources(ray=on_ray, reclaim=not on_ray)


@dataclass
class Curation:
    """One run's inputs, folders and what its steps hand each other."""

    cfg: CurateConfig
    output_dir: str
    extra_filters: list[DocumentFilter] = field(default_factory=list)
    backend: str = ""
    files: list[str] = field(default_factory=list)
    tasks: list = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    report: dict | None = None
    t0: float = field(default_factory=time.perf_counter)
    work_dir: str = ""
    resumed_tasks: int = 0

    @property
    def rejected_dir(self) -> str:
        return os.path.join(self.output_dir, "rejected")

    @property
    def stream_dir(self) -> str:
        """Streamed candidates and the ledger of finished tasks (kept across a killed run)."""
        return os.path.join(self.work_dir, "stream")

    @property
    def stream_rejected_dir(self) -> str:
        """The stream's rejected parts, copied to `rejected/` once the run finishes."""
        return os.path.join(self.work_dir, "stream-rejected")

    @classmethod
    def prepare(
        cls,
        cfg: CurateConfig,
        output_dir: str,
        extra_filters: list[DocumentFilter] = (),
        work_dir: str | None = None,
    ) -> Curation:
        """Expand the inputs, resolve the backend and lay out an empty output folder. The work
        folder (default `<output_dir>/_work`) keeps the streamed tasks of a killed attempt with
        the same config and inputs; they are not streamed again."""
        if cfg.filters.japanese_words == "tokenizer":  # before any work: one line naming `ja`
            require_segmenter()
        files = expand_inputs(cfg.input)
        tasks = plan_tasks(files, cfg.read.split_bytes, cfg.read.text_files_per_task)
        backend = resolve_backend(cfg.backend, cfg.cluster)
        if backend != cfg.backend:  # actors see the resolved backend (GPU MinHash under cudf)
            cfg = cfg.model_copy(update={"backend": backend})
        os.makedirs(output_dir, exist_ok=True)
        work_dir = work_dir or os.path.join(output_dir, "_work")
        plan = _plan(cfg, files, tasks, list(extra_filters))
        stream_dir = os.path.join(work_dir, "stream")
        resuming = Ledger.holds(stream_dir, plan)
        shards = glob.glob(os.path.join(output_dir, "shard-*.parquet"))
        if shards and not resuming:
            raise InputError(
                f"{output_dir}: already holds curated shards (expected an empty output folder)"
            )
        for shard in shards:  # a killed attempt's output step: written again
            os.remove(shard)
        cur = cls(cfg, output_dir, list(extra_filters), backend, files, tasks, work_dir=work_dir)
        for d in os.listdir(work_dir) if os.path.isdir(work_dir) else []:
            if d not in ("stream", "stream-rejected"):  # dedup's spills start afresh
                shutil.rmtree(os.path.join(work_dir, d), ignore_errors=True)
        shutil.rmtree(cur.rejected_dir, ignore_errors=True)
        os.makedirs(cur.rejected_dir)
        Ledger.open(stream_dir, plan)
        if not resuming:
            shutil.rmtree(cur.stream_rejected_dir, ignore_errors=True)
        os.makedirs(cur.stream_rejected_dir, exist_ok=True)
        return cur

    def stream(self, runtime: Runtime | None) -> None:
        """Read, clean and filter every document into the work folder's `stream/`; tasks a
        killed attempt finished are taken from its ledger, not run again."""
        cpus = runtime.cpus_per_worker() if self.cfg.stream == "ray" and runtime else 0.5
        finished = Ledger(self.stream_dir).finished()
        todo = [task for task in self.tasks if task.index not in finished]
        self.resumed_tasks = len(self.tasks) - len(todo)
        log.info(
            "curating %d files in %d tasks (%d already streamed)",
            len(self.files),
            len(self.tasks),
            self.resumed_tasks,
        )
        clear_unfinished(todo, self.stream_dir, self.stream_rejected_dir)
        documents = 0
        # counted in input bytes: a one-file input split into byte ranges moves as they finish
        sizes = {task.index: task_bytes(task) for task in todo}

        def task_done(counts: dict) -> None:
            nonlocal documents
            documents += counts["in"]
            progress.advance(sizes[counts["task"]], f"{documents:,} documents")

        with Progress(sum(sizes.values()), "curate", unit="B", scale=True) as progress:
            streamed = run_stream(
                todo,
                self.cfg,
                self.stream_dir,
                self.stream_rejected_dir,
                self.extra_filters,
                cpus,
                on_task=task_done,
            )
        self.stats = sorted(
            [*(finished[t.index] for t in self.tasks if t.index in finished), *streamed],
            key=lambda s: s["task"],
        )
        self.seconds["stream"] = time.perf_counter() - self.t0

    def finish(self) -> dict:
        """Dedup the streamed documents, write shards and the report; returns the report."""
        staging = sorted(glob.glob(os.path.join(self.stream_dir, "*.parquet")))
        for name in sorted(os.listdir(self.stream_rejected_dir)):  # copied: a killed output
            shutil.copyfile(  # step finds them still there
                os.path.join(self.stream_rejected_dir, name),
                os.path.join(self.rejected_dir, name),
            )
        dedup = self._dedup(staging)
        cut_rows = self._cut_repeats(staging, dedup)
        t = time.perf_counter()
        kept = write_outputs(
            staging,
            dedup.exact_rows,
            dedup.fuzzy_rows,
            self.output_dir,
            self.rejected_dir,
            os.path.join(self.work_dir, "spill"),
            self.cfg.output,
            dedup.semantic_rows,
            cut_rows,
        )
        self.seconds["output"] = time.perf_counter() - t
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.seconds["total"] = time.perf_counter() - self.t0
        self.report = self._report(dedup.counts, kept)
        return self.report

    def _dedup(self, staging: list[str]):
        cfg = self.cfg
        t = time.perf_counter()
        spill = os.path.join(self.work_dir, "dask")
        with dask_session(
            self.backend, cfg.cluster, cfg.rmm_async, cfg.rmm_release_threshold, spill_dir=spill
        ):
            n_candidates = sum(s["in"] - sum(s["reasons"].values()) for s in self.stats)
            dedup = run_dedup(staging, cfg, self.backend, n_candidates)
        self.seconds["dedup"] = time.perf_counter() - t
        return dedup

    def _cut_repeats(self, staging: list[str], dedup) -> dict:
        """Substring and sentence dedup (off by default) on what the other dedups kept; their
        counts join `dedup.counts`, their dropped rows are returned by reason."""
        d = self.cfg.dedup
        if not staging or not (d.substring.enabled or d.sentence.enabled):
            return {}
        t = time.perf_counter()
        skip = np.concatenate([dedup.exact_rows, dedup.fuzzy_rows, dedup.semantic_rows])
        rows, counts = cut_repeats(staging, np.unique(skip), d, self.work_dir)
        dedup.counts.update(counts)
        self.seconds["cut_repeats"] = time.perf_counter() - t
        return rows

    def _pii(self) -> dict | None:
        """The PII step's mode and counts summed over every task (None when it is off)."""
        if not self.cfg.pii.enabled:
            return None
        total = PiiCounts()
        for s in self.stats:
            total.add(PiiCounts.from_dict(s.get("pii", {})))
        return {"mode": self.cfg.pii.mode, **total.to_dict()}

    def _report(self, dedup_counts: dict, kept: int) -> dict:
        cfg, seconds = self.cfg, self.seconds
        reasons = sum((Counter(s["reasons"]) for s in self.stats), Counter())
        n_in = sum(s["in"] for s in self.stats)
        names = [f.name for f in build_filters(cfg.filters, list(self.extra_filters))]
        report = build_report(n_in, reasons, names, dedup_counts, kept, seconds, self._pii())
        report["backend"], report["cluster"], report["stream"] = (
            self.backend,
            cfg.cluster,
            cfg.stream,
        )
        report["docs_per_s"] = n_in / seconds["total"] if seconds["total"] else 0.0
        resumed = self.resumed_tasks
        report["tasks"] = {
            "total": len(self.tasks),
            "resumed": resumed,
            "processed": len(self.tasks) - resumed,
        }
        write_report(report, os.path.join(self.output_dir, "report.json"))
        if cfg.output.plot:
            plot_funnel(report, os.path.join(self.output_dir, "funnel.png"))
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


def _plan(cfg: CurateConfig, files: list[str], tasks: list, extra_filters: list) -> dict:
    """What the streamed tasks depend on: a work folder left under another plan starts over."""
    signature = [[os.path.abspath(f), *_stat(f)] for f in files]
    return {
        "config": cfg.model_dump(mode="json"),
        "files": signature,
        "tasks": [t.to_dict() for t in tasks],
        "extra_filters": [repr(f) for f in extra_filters],
    }


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def task_bytes(task: ReadTask) -> int:
    """The input bytes a read task covers (a Parquet row group: its share of the file)."""
    if task.kind == "text":
        return sum(os.path.getsize(f) for f in task.files or [task.path])
    if task.kind == "jsonl" and task.end >= 0:
        return task.end - task.start
    size = os.path.getsize(task.path)
    if task.kind == "parquet":
        import pyarrow.parquet as pq

        return size // max(pq.ParquetFile(task.path).num_row_groups, 1)
    return size


def curate(
    cfg: CurateConfig,
    output_dir: str,
    extra_filters: list[DocumentFilter] = (),
    runtime: Runtime | None = None,
    work_dir: str | None = None,
) -> dict:
    """Curate `cfg.input` into `output_dir` (shards, rejected/, report.json, funnel.png).

    Both steps in one call on `runtime` (default: the session's Ray, else an embedded one that
    is started for streaming and shut down before dedup on Dask threads). A killed run's streamed
    tasks stay in `work_dir` (default `<output_dir>/_work`): the next call streams the rest."""
    own = runtime is None
    runtime = runtime or Runtime()
    cur = Curation.prepare(cfg, output_dir, extra_filters, work_dir)
    stream_needs, dedup_needs = step_needs(cur.cfg)
    try:
        runtime.provide(stream_needs, "curate.stream")
        cur.stream(runtime)
        runtime.provide(dedup_needs, "curate.dedup")
        return cur.finish()
    finally:
        if own:
            runtime.shutdown()
