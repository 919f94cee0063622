"""Pipelines: stages wired by artifact names, run with caching, resume and a lineage record.

A run lives in `<runs>/<pipeline>/<run-id>/`: one folder per stage and `run.json` with each
stage's status, timings, metrics and fingerprints. A stage whose fingerprint matches complete
outputs of an earlier run of the same pipeline is skipped (`status: cached`), so re-running a
spec after a crash resumes at the first unfinished stage.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.platform import console, signals
from kiln.platform.artifact import MANIFEST, Artifact
from kiln.platform.errors import ConfigError, KilnError, SpecError, StageFailed
from kiln.platform.provenance import provenance
from kiln.platform.report_html import write_report
from kiln.platform.runtime import RayConfig, Runtime
from kiln.platform.stage import Stage, StageContext, needs_ray, run_steps

log = logging.getLogger("kiln")


def key_figures(metrics: Any, limit: int = 4) -> str:
    """` (name value, ...)`: a stage's first few scalar metrics, for its one-line summary."""
    if not isinstance(metrics, dict):
        return ""
    shown = []
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or k.endswith("_s"):
            continue
        shown.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
    return f" ({', '.join(shown[:limit])})" if shown else ""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def _default_runs_dir() -> str:
    return os.environ.get("KILN_RUNS_DIR", "runs")


def local_runs_dir(runs_dir: str | os.PathLike) -> Path:
    """Runs folders are local: the cache lookup lists and renames inside them. (Artifacts a
    stage reads or writes may still be fsspec URIs.)"""
    text = os.fspath(runs_dir)
    if "://" in text:
        raise ConfigError(
            f"runs_dir {text}: expected a local folder (a URI such as s3:// is not supported for "
            "runs; mount the bucket, or point checkpoint.dir at it)"
        )
    return Path(text).resolve()


def _is_path_ref(ref: str) -> bool:
    return "/" in ref or "://" in ref or ref.startswith(".")


@dataclass
class RunResult:
    run_dir: Path
    record: dict[str, Any]
    outputs: dict[str, Artifact] = field(default_factory=dict)  # "<stage>.<slot>" -> artifact

    def stage_status(self, name: str) -> str:
        return self.record["stages"][name]["status"]

    def artifact(self, ref: str) -> Artifact:
        return self.outputs[ref]


class Pipeline:
    """An ordered list of stages. Inputs not named explicitly take the latest earlier output
    of the same kind, so `curate -> tokenize -> train -> export -> serve` needs no wiring."""

    def __init__(
        self,
        name: str,
        stages: list[Stage],
        runs_dir: str | os.PathLike | None = None,
        ray: RayConfig | None = None,
    ):
        if not name or "/" in name:
            raise SpecError(f"pipeline name {name!r}: expected a non-empty name without '/'")
        self.name = name
        self.stages = list(stages)
        self.runs_dir = local_runs_dir(runs_dir or _default_runs_dir())
        self.ray = ray or RayConfig()
        # what run.json records as the spec: the file it came from and its `--set` overrides
        self.spec_source: str | None = None
        self.overrides: list[str] = []
        seen: set[str] = set()
        for st in self.stages:
            if st.name in seen:
                raise SpecError(f"stage name {st.name!r} is used twice; give one a `name:`")
            seen.add(st.name)
        self.wiring = self._wire()

    def _wire(self) -> dict[str, dict[str, str]]:
        """stage -> slot -> "<stage>.<slot>" of an earlier output, or an artifact path."""
        produced: list[tuple[str, str]] = []  # (ref, kind) in order
        wiring: dict[str, dict[str, str]] = {}
        for st in self.stages:
            slots: dict[str, str] = {}
            for slot, kind in st.input_kinds.items():
                ref = st.inputs.get(slot)
                if ref is None:
                    candidates = [r for r, k in produced if k == kind]
                    if candidates:
                        slots[slot] = candidates[-1]
                    elif slot not in st.optional_inputs:
                        raise SpecError(
                            f"{st.name}.inputs.{slot}: no earlier stage produces a {kind}; "
                            f"name one as `inputs: {{{slot}: <stage>.<slot> or a path}}`"
                        )
                    continue
                if not _is_path_ref(ref):
                    match = [k for r, k in produced if r == ref]
                    if not match:
                        known = ", ".join(r for r, _ in produced) or "none"
                        raise SpecError(
                            f"{st.name}.inputs.{slot}: unknown artifact {ref!r} "
                            f"(earlier outputs: {known})"
                        )
                    if match[0] != kind:
                        raise SpecError(
                            f"{st.name}.inputs.{slot}: {ref!r} is a {match[0]}, expected a {kind}"
                        )
                slots[slot] = ref
            wiring[st.name] = slots
            produced += [(f"{st.name}.{slot}", kind) for slot, kind in st.output_kinds.items()]
        return wiring

    # -- running -------------------------------------------------------------------------

    def run(
        self,
        *,
        run_id: str | None = None,
        force: list[str] | tuple[str, ...] = (),
        runtime: Runtime | None = None,
        shutdown: bool = True,
    ) -> RunResult:
        unknown = set(force) - {st.name for st in self.stages}
        if unknown:
            raise SpecError(
                f"--force {min(unknown)}: no such stage "
                f"(stages: {', '.join(s.name for s in self.stages)})"
            )
        runtime = runtime or Runtime.from_config(self.ray)
        for st in self.stages:  # a late stage's mistake fails the run now, before any Ray starts
            st.preflight(runtime, frozenset(self.wiring[st.name]))
        run_id = run_id or _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        run_dir = self.runs_dir / self.name / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {
            "pipeline": self.name,
            "run_id": run_id,
            "status": "running",
            "started": _now(),
            "stages": {st.name: {"type": st.type_name, "status": "pending"} for st in self.stages},
            **provenance(self),
        }
        result = RunResult(run_dir=run_dir, record=record)
        self._write(run_dir, record)
        run_log = console.attach_run_log(run_dir)
        log.debug("run %s: %s", run_id, run_dir)  # the summary prints the folder
        try:
            for i, st in enumerate(self.stages):
                runtime.ray_later = any(needs_ray(later) for later in self.stages[i + 1 :])
                self._run_stage(st, run_dir, record, result, runtime, force=st.name in force)
                self._write(run_dir, record)
            record["status"] = "succeeded"
        except BaseException as e:
            stop = signals.as_interruption(e)
            if stop is None:
                record["status"] = "failed"
                record["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise
            record["status"] = "interrupted"
            record["interrupted_by"] = str(stop)
            for entry in record["stages"].values():  # stopped mid-way; the rest stay as they were
                if entry["status"] == "running":
                    entry.update(status="interrupted", ended=_now())
            log.debug("run interrupted (%s): the same command resumes it", stop)
            if stop is e:
                raise
            raise stop from e
        finally:
            record["ended"] = _now()
            self._write(run_dir, record)
            self._write_report(run_dir)
            console.link_ray_logs(run_dir)
            console.detach_run_log(run_log)
            if shutdown:
                runtime.shutdown()
        return result

    def _resolve_inputs(self, st: Stage, result: RunResult) -> dict[str, Artifact]:
        inputs: dict[str, Artifact] = {}
        for slot, ref in self.wiring[st.name].items():
            art = result.outputs[ref] if ref in result.outputs else Artifact.load(ref)
            expected = st.input_kinds[slot]
            if art.kind != expected:
                raise SpecError(
                    f"{st.name}.inputs.{slot}: {ref} is a {art.kind}, expected a {expected}"
                )
            inputs[slot] = art
        return inputs

    def _run_stage(
        self,
        st: Stage,
        run_dir: Path,
        record: dict,
        result: RunResult,
        runtime: Runtime,
        force: bool,
    ):
        entry = record["stages"][st.name]
        inputs = self._resolve_inputs(st, result)
        fp = st.fingerprint({slot: a.fingerprint for slot, a in inputs.items()})
        entry.update(
            fingerprint=fp,
            inputs={s: {"uri": a.uri, "fingerprint": a.fingerprint} for s, a in inputs.items()},
        )
        stage_dir = run_dir / st.name
        stage_dir.mkdir(parents=True, exist_ok=True)

        cached = None if (force or not st.cacheable) else self._find_cached(st, fp)
        if cached is not None:
            outputs, source = cached
            now = _now()
            entry.update(
                status="cached", cached_from=str(source), started=now, ended=now, duration_s=0.0
            )
            (stage_dir / "CACHED").write_text(f"{source}\n")
            log.info("stage %s: cached (%s)", st.name, source)
        else:
            outputs = self._fresh_outputs(st, stage_dir, fp)
            entry.update(status="running", started=_now())
            self._write(run_dir, record)
            log.info("stage %s: started", st.name)
            console.route_library_loggers()
            ctx = StageContext(
                stage=st,
                run_dir=run_dir,
                stage_dir=stage_dir,
                inputs=inputs,
                outputs=outputs,
                runtime=runtime,
                work_dir=self.work_dir(st, fp),
            )
            self._execute(st, ctx, entry)
        entry["outputs"] = {
            slot: {"uri": a.uri, "kind": a.kind, "counts": a.counts} for slot, a in outputs.items()
        }
        for slot, art in outputs.items():
            result.outputs[f"{st.name}.{slot}"] = art

    def work_dir(self, st: Stage, fingerprint: str) -> Path:
        """A stage's work folder: kept across failed attempts (same fingerprint: a re-run resumes
        from what it holds), removed once the stage succeeds. Created by the stage that uses it,
        so a run folder holds `.work` only while such a stage is unfinished."""
        return self.runs_dir / self.name / ".work" / f"{st.name}-{fingerprint}"

    @staticmethod
    def _fresh_outputs(st: Stage, stage_dir: Path, fp: str) -> dict[str, Artifact]:
        outputs = {
            slot: Artifact(uri=str(stage_dir / slot), kind=kind, fingerprint=fp, stage=st.name)
            for slot, kind in st.output_kinds.items()
        }
        for art in outputs.values():  # a crashed attempt's leftovers are not trusted
            shutil.rmtree(art.uri, ignore_errors=True)
            Path(art.uri).mkdir(parents=True)
        return outputs

    @staticmethod
    def _execute(st: Stage, ctx: StageContext, entry: dict) -> None:
        """Run the stage's steps, commit its outputs, record the outcome in `entry`."""
        t0 = time.perf_counter()

        def failed(error: str) -> None:
            entry.update(
                status="failed",
                error=error,
                ended=_now(),
                duration_s=round(time.perf_counter() - t0, 3),
            )

        try:
            metrics = run_steps(st, ctx)
        except BaseException as e:
            stop = signals.as_interruption(e)  # also a library's error raised on the way out
            if stop is not None:
                entry.update(
                    status="interrupted",
                    ended=_now(),
                    duration_s=round(time.perf_counter() - t0, 3),
                )
                if stop is e:
                    raise
                raise stop from e
            if isinstance(e, KilnError):
                failed(str(e))
                raise
            if not isinstance(e, Exception):
                raise
            failed(f"{type(e).__name__}: {e}")
            (ctx.stage_dir / "error.txt").write_text(traceback.format_exc())
            raise StageFailed(
                f"stage {st.name} failed: {type(e).__name__}: {e} "
                f"(traceback in {ctx.stage_dir / 'error.txt'})"
            ) from e
        if not st.cacheable:  # its effect (a running endpoint) lives on this Ray
            ctx.runtime.hold(st.name)
        for art in ctx.outputs.values():
            art.commit()
        shutil.rmtree(ctx.work_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # `.work` holds only unfinished stages' folders
            ctx.work_dir.parent.rmdir()
        entry.update(
            status="done",
            ended=_now(),
            duration_s=round(time.perf_counter() - t0, 3),
            metrics=metrics,
        )
        log.info("stage %s: done in %.1fs%s", st.name, entry["duration_s"], key_figures(metrics))

    def _find_cached(self, st: Stage, fp: str) -> tuple[dict[str, Artifact], Path] | None:
        """Complete outputs of an earlier run with the same fingerprint, newest first."""
        if not st.output_kinds:
            return None
        root = self.runs_dir / self.name
        candidates = sorted(
            root.glob(f"*/{st.name}"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for stage_dir in candidates:
            outputs = {}
            for slot in st.output_kinds:
                manifest = stage_dir / slot / MANIFEST
                if not manifest.exists():
                    break
                art = Artifact.load(str(stage_dir / slot))
                if art.fingerprint != fp:
                    break
                outputs[slot] = art
            else:
                return outputs, stage_dir
        return None

    @staticmethod
    def _write_report(run_dir: Path) -> None:
        """report.html, also after a failure; a report that cannot be drawn never fails a run."""

        try:
            log.info("report: %s", write_report(run_dir))
        except Exception as e:  # noqa: BLE001 - the run's outcome matters more than its page
            log.warning("report.html not written: %s: %s", type(e).__name__, e)

    @staticmethod
    def _write(run_dir: Path, record: dict) -> None:
        tmp = run_dir / "run.json.tmp"
        tmp.write_text(json.dumps(record, indent=2, default=str))
        os.replace(tmp, run_dir / "run.json")
