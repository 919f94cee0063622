"""Platform subcommands: run, submit, status, logs, stages."""

from __future__ import annotations

import argparse
import os
import sys

from kiln.platform import jobs
from kiln.platform.errors import ConfigError
from kiln.platform.runtime import Runtime
from kiln.platform.signals import stop_on_signals
from kiln.platform.spec import load_pipeline
from kiln.platform.stage_help import print_stages


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a pipeline spec (YAML) on an embedded or existing Ray")
    p.add_argument("spec", help="pipeline YAML")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="STAGE.FIELD=VALUE"
    )
    p.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="STAGE",
        help="re-run this stage even if cached",
    )
    p.add_argument(
        "--runs-dir",
        help="where runs are kept (default: spec's runs_dir, $KILN_RUNS_DIR or ./runs)",
    )
    p.add_argument("--run-id", help="name of this run's folder (default: a timestamp)")
    p.add_argument(
        "--address",
        help="Ray cluster to attach to (default: $RAY_ADDRESS, the spec's ray.address, else an "
        "embedded Ray)",
    )
    p.add_argument(
        "--dashboard", action="store_true", help="start the Ray dashboard with the embedded Ray"
    )
    p.set_defaults(handler="kiln.platform.commands:run_command")

    p = sub.add_parser("submit", help="submit a pipeline spec to a Ray cluster as a job")
    p.add_argument("spec")
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS"),
        help="Ray dashboard URL, e.g. http://127.0.0.1:8265",
    )
    p.add_argument("--working-dir", default=".", help="uploaded with the job (default: .)")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="STAGE.FIELD=VALUE"
    )
    p.add_argument("--runs-dir", help="runs folder on the cluster (an absolute local path)")
    p.add_argument(
        "--python", default="python", help="interpreter on the cluster (default: python)"
    )
    p.add_argument("--job-id", help="submission id (default: generated)")
    p.add_argument(
        "--wait", action="store_true", help="stream logs and exit with the job's outcome"
    )
    p.set_defaults(handler="kiln.platform.commands:submit_command")

    for name, helptext in (("status", "a job's status"), ("logs", "a job's logs")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("job_id")
        p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
        p.set_defaults(handler=f"kiln.platform.commands:{name}_command")

    p = sub.add_parser(
        "stages", help="list the stages a spec can name; one stage's fields and model presets"
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="a stage: show its config fields")
    p.set_defaults(handler="kiln.platform.commands:stages_command")


def run_command(args) -> int:
    stop_on_signals()  # SIGINT/SIGTERM: the stage is interrupted, the embedded Ray shut down
    pipeline = load_pipeline(args.spec, args.overrides, runs_dir=args.runs_dir)
    result = pipeline.run(
        run_id=args.run_id,
        force=args.force,
        runtime=Runtime.from_config(pipeline.ray, address=args.address, dashboard=args.dashboard),
    )
    for name, entry in result.record["stages"].items():
        print(f"  {name:<16} {entry['status']:<8} {entry.get('duration_s', 0):>8.1f}s")
    print(f"run directory: {result.run_dir.resolve()}")
    return 0


def _need_address(args) -> str:
    if not args.address:
        raise ConfigError(
            "--address: expected the Ray dashboard URL (or set RAY_ADDRESS), e.g. http://127.0.0.1:8265"
        )
    return args.address


def submit_command(args) -> int:
    address = _need_address(args)
    job_id = jobs.submit(
        args.spec,
        address,
        working_dir=args.working_dir,
        overrides=args.overrides,
        runs_dir=args.runs_dir,
        python=args.python,
        job_id=args.job_id,
    )
    print(f"submitted job {job_id}")
    if not args.wait:
        print(f"follow it with: kiln logs {job_id} --address {address}")
        return 0
    state = jobs.wait(job_id, address)
    print(f"job {job_id}: {state}")
    return 0 if state == "SUCCEEDED" else 1


def status_command(args) -> int:
    print(jobs.status(args.job_id, _need_address(args)))
    return 0


def logs_command(args) -> int:
    sys.stdout.write(jobs.logs(args.job_id, _need_address(args)))
    return 0


def stages_command(args) -> int:
    return print_stages(args.name)
