"""`kiln runs` lists the runs under a runs folder, newest first; `kiln runs rm` / `kiln runs gc`
remove them (kiln/platform/runs_cleanup.py); `kiln report RUN_DIR` renders (again) a run's
`report.html`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kiln.platform.errors import InputError
from kiln.platform.report_html import write_report
from kiln.platform.runs import format_runs, list_runs
from kiln.platform.runs_cleanup import format_removal, remove_runs, resolve_run, runs_to_collect


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
    p.set_defaults(handler="kiln.platform.runs_cli:runs_command", pipeline=None)
    # the subcommands' copies of the shared options must not reset what came before them
    runs_sub = p.add_subparsers(action=_ListByDefault, metavar="{ls,rm,gc}")
    ls = runs_sub.add_parser("ls", help="list runs (the default)")
    ls.add_argument("pipeline", nargs="?", help="only this pipeline's runs")
    _list_options(ls, argparse.SUPPRESS)

    rm = runs_sub.add_parser("rm", help="remove runs (a running one only with --force)")
    rm.add_argument("runs", nargs="+", metavar="RUN", help="a run folder or <pipeline>/<run-id>")
    _cleanup_options(rm)
    rm.set_defaults(handler="kiln.platform.runs_cli:rm_command")

    gc = runs_sub.add_parser("gc", help="remove all but the newest N runs of each pipeline")
    gc.add_argument("pipeline", nargs="?", help="only this pipeline's runs")
    gc.add_argument("--keep", type=int, required=True, metavar="N", help="runs kept per pipeline")
    _cleanup_options(gc)
    gc.set_defaults(handler="kiln.platform.runs_cli:gc_command")

    p = sub.add_parser("report", help="write a run folder's report.html (again)")
    p.add_argument("run_dir", help="runs/<pipeline>/<run-id>")
    p.set_defaults(handler="kiln.platform.runs_cli:report_command")


def _cleanup_options(p: argparse.ArgumentParser) -> None:
    _runs_dir_option(p, argparse.SUPPRESS)
    p.add_argument("--force", action="store_true", help="also remove running or reused runs")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")


def _runs_dir(args) -> Path:
    runs_dir = Path(args.runs_dir or os.environ.get("KILN_RUNS_DIR", "runs"))
    if not runs_dir.is_dir():
        raise InputError(f"--runs-dir {runs_dir}: no such folder")
    return runs_dir


def runs_command(args) -> int:
    runs_dir = _runs_dir(args)
    runs = list_runs(runs_dir, args.pipeline)
    if not runs:
        print(f"no runs under {runs_dir}" + (f" for {args.pipeline}" if args.pipeline else ""))
        return 0
    print(format_runs(runs[: args.limit] if args.limit else runs))
    return 0


def rm_command(args) -> int:
    runs_dir = _runs_dir(args)
    targets = [resolve_run(ref, runs_dir) for ref in args.runs]
    result = remove_runs(targets, runs_dir, force=args.force, dry_run=args.dry_run)
    print(format_removal(result, runs_dir, args.dry_run))
    return 1 if result.skipped else 0


def gc_command(args) -> int:
    if args.keep < 0:
        raise InputError(f"--keep {args.keep}: expected 0 or more runs to keep")
    runs_dir = _runs_dir(args)
    old = runs_to_collect(list_runs(runs_dir, args.pipeline), args.keep)
    result = remove_runs(old, runs_dir, force=args.force, dry_run=args.dry_run)
    print(format_removal(result, runs_dir, args.dry_run))
    return 0


def report_command(args) -> int:
    if not (Path(args.run_dir) / "run.json").exists():
        raise InputError(f"{args.run_dir}: not a run folder (no run.json)")
    print(write_report(args.run_dir))
    return 0
