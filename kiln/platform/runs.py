"""`kiln runs`: the runs under a runs folder with their status and time, newest first;
`kiln report RUN_DIR` renders (again) a run's `report.html`."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

from kiln.platform.errors import InputError


@dataclass
class RunInfo:
    pipeline: str
    run_id: str
    status: str
    started: str
    duration_s: float | None
    stages_done: int
    stages: int
    path: Path

    @property
    def report(self) -> Path | None:
        path = self.path / "report.html"
        return path if path.exists() else None


def _seconds(started: str | None, ended: str | None) -> float | None:
    try:
        a, b = _dt.datetime.fromisoformat(started), _dt.datetime.fromisoformat(ended)
    except (TypeError, ValueError):
        return None
    return (b - a).total_seconds()


def list_runs(runs_dir: str | Path, pipeline: str | None = None) -> list[RunInfo]:
    """Every `<runs_dir>/<pipeline>/<run>/run.json`, newest first."""
    root = Path(runs_dir)
    pattern = f"{pipeline}/*/run.json" if pipeline else "*/*/run.json"
    out = []
    for path in root.glob(pattern):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        stages = rec.get("stages", {})
        out.append(
            RunInfo(
                pipeline=rec.get("pipeline", path.parent.parent.name),
                run_id=rec.get("run_id", path.parent.name),
                status=rec.get("status", "unknown"),
                started=rec.get("started", ""),
                duration_s=_seconds(rec.get("started"), rec.get("ended")),
                stages_done=sum(e.get("status") in ("done", "cached") for e in stages.values()),
                stages=len(stages),
                path=path.parent,
            )
        )
    return sorted(out, key=lambda r: r.started, reverse=True)


def format_runs(runs: list[RunInfo]) -> str:
    head = (
        f"{'PIPELINE':<16} {'RUN':<24} {'STATUS':<10} {'STARTED':<20} {'TIME':>8}  STAGES  REPORT"
    )
    lines = [head]
    for r in runs:
        started = r.started[:19].replace("T", " ")
        took = f"{r.duration_s:.1f}s" if r.duration_s is not None else "-"
        report = str(r.report) if r.report else "-"
        lines.append(
            f"{r.pipeline:<16} {r.run_id:<24} {r.status:<10} {started:<20} {took:>8}  "
            f"{r.stages_done:>2}/{r.stages:<3}  {report}"
        )
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list runs with their status and time (newest first)")
    p.add_argument("pipeline", nargs="?", help="only this pipeline's runs")
    p.add_argument("--runs-dir", help="runs folder (default: $KILN_RUNS_DIR or ./runs)")
    p.add_argument("-n", "--limit", type=int, default=20, help="at most this many (0: all)")
    p.set_defaults(func=_runs)

    p = sub.add_parser("report", help="write a run folder's report.html (again)")
    p.add_argument("run_dir", help="runs/<pipeline>/<run-id>")
    p.set_defaults(func=_report)


def _runs(args) -> int:
    import os

    runs_dir = Path(args.runs_dir or os.environ.get("KILN_RUNS_DIR", "runs"))
    if not runs_dir.is_dir():
        raise InputError(f"--runs-dir {runs_dir}: no such folder")
    runs = list_runs(runs_dir, args.pipeline)
    if not runs:
        print(f"no runs under {runs_dir}" + (f" for {args.pipeline}" if args.pipeline else ""))
        return 0
    print(format_runs(runs[: args.limit] if args.limit else runs))
    return 0


def _report(args) -> int:
    from kiln.platform.report_html import write_report

    if not (Path(args.run_dir) / "run.json").exists():
        raise InputError(f"{args.run_dir}: not a run folder (no run.json)")
    print(write_report(args.run_dir))
    return 0
