"""`kiln runs`: the runs under a runs folder with their status and time, newest first
(`kiln runs rm` / `kiln runs gc` remove them: kiln/platform/runs_cleanup.py);
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


class _ListByDefault(argparse._SubParsersAction):
    """`kiln runs [PIPELINE]` lists: a word that is not a subcommand is `ls`'s pipeline."""

    class _AnyWord:
        def __contains__(self, word: object) -> bool:
            return True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = self._AnyWord()  # argparse checks choices before calling the action

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] not in self._name_parser_map:
            values = ["ls", *values]
        super().__call__(parser, namespace, values, option_string)


def _runs_dir_option(p: argparse.ArgumentParser, default=None) -> None:
    p.add_argument(
        "--runs-dir", default=default, help="runs folder (default: $KILN_RUNS_DIR or ./runs)"
    )


def _list_options(p: argparse.ArgumentParser, default=None) -> None:
    _runs_dir_option(p, default)
    p.add_argument(
        "-n",
        "--limit",
        type=int,
        default=20 if default is None else default,
        help="at most this many (0: all)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runs",
        help="list runs with their status and time (newest first); rm, gc",
        description="kiln runs [PIPELINE] lists runs; kiln runs rm RUN... removes runs; "
        "kiln runs gc --keep N [PIPELINE] removes all but each pipeline's newest N.",
    )
    _list_options(p)
    p.set_defaults(func=_runs, pipeline=None)
    # the subcommands' copies of the shared options must not reset what came before them
    runs_sub = p.add_subparsers(action=_ListByDefault, metavar="{ls,rm,gc}")
    ls = runs_sub.add_parser("ls", help="list runs (the default)")
    ls.add_argument("pipeline", nargs="?", help="only this pipeline's runs")
    _list_options(ls, argparse.SUPPRESS)

    rm = runs_sub.add_parser("rm", help="remove runs (a running one only with --force)")
    rm.add_argument("runs", nargs="+", metavar="RUN", help="a run folder or <pipeline>/<run-id>")
    _cleanup_options(rm)
    rm.set_defaults(func=_rm)

    gc = runs_sub.add_parser("gc", help="remove all but the newest N runs of each pipeline")
    gc.add_argument("pipeline", nargs="?", help="only this pipeline's runs")
    gc.add_argument("--keep", type=int, required=True, metavar="N", help="runs kept per pipeline")
    _cleanup_options(gc)
    gc.set_defaults(func=_gc)

    p = sub.add_parser("report", help="write a run folder's report.html (again)")
    p.add_argument("run_dir", help="runs/<pipeline>/<run-id>")
    p.set_defaults(func=_report)


def _cleanup_options(p: argparse.ArgumentParser) -> None:
    _runs_dir_option(p, argparse.SUPPRESS)
    p.add_argument("--force", action="store_true", help="also remove running or reused runs")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")


def _runs_dir(args) -> Path:
    import os

    runs_dir = Path(args.runs_dir or os.environ.get("KILN_RUNS_DIR", "runs"))
    if not runs_dir.is_dir():
        raise InputError(f"--runs-dir {runs_dir}: no such folder")
    return runs_dir


def _runs(args) -> int:
    runs_dir = _runs_dir(args)
    runs = list_runs(runs_dir, args.pipeline)
    if not runs:
        print(f"no runs under {runs_dir}" + (f" for {args.pipeline}" if args.pipeline else ""))
        return 0
    print(format_runs(runs[: args.limit] if args.limit else runs))
    return 0


def _rm(args) -> int:
    from kiln.platform.runs_cleanup import format_removal, remove_runs, resolve_run

    runs_dir = _runs_dir(args)
    targets = [resolve_run(ref, runs_dir) for ref in args.runs]
    result = remove_runs(targets, runs_dir, force=args.force, dry_run=args.dry_run)
    print(format_removal(result, runs_dir, args.dry_run))
    return 1 if result.skipped else 0


def _gc(args) -> int:
    from kiln.platform.runs_cleanup import format_removal, remove_runs, runs_to_collect

    if args.keep < 0:
        raise InputError(f"--keep {args.keep}: expected 0 or more runs to keep")
    runs_dir = _runs_dir(args)
    old = runs_to_collect(list_runs(runs_dir, args.pipeline), args.keep)
    result = remove_runs(old, runs_dir, force=args.force, dry_run=args.dry_run)
    print(format_removal(result, runs_dir, args.dry_run))
    return 0


def _report(args) -> int:
    from kiln.platform.report_html import write_report

    if not (Path(args.run_dir) / "run.json").exists():
        raise InputError(f"{args.run_dir}: not a run folder (no run.json)")
    print(write_report(args.run_dir))
    return 0
