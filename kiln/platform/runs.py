"""The runs under a runs folder, with their status and time, newest first (`kiln runs`)."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path


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
        f"{'PIPELINE':<16} {'RUN':<24} {'STATUS':<11} {'STARTED':<20} {'TIME':>8}  STAGES  REPORT"
    )
    lines = [head]
    for r in runs:
        started = r.started[:19].replace("T", " ")
        took = f"{r.duration_s:.1f}s" if r.duration_s is not None else "-"
        report = str(r.report) if r.report else "-"
        lines.append(
            f"{r.pipeline:<16} {r.run_id:<24} {r.status:<11} {started:<20} {took:>8}  "
            f"{r.stages_done:>2}/{r.stages:<3}  {report}"
        )
    return "\n".join(lines)
