"""What a `kiln` command prints, and where everything else goes.

Quiet (the default): the terminal shows kiln's own INFO lines (a stage's start and end, the
trainer's progress) in a short `HH:MM:SS message` form, warnings and errors from anyone, and the
final table. Ray's, Ray Data's, Ray Train's and Serve's output, Python warnings and debug lines
go to `<run>/logs/kiln.log` (every record, full format) and Ray's own session logs, which
`<run>/logs/ray` links to. `-v` (verbose) prints all of it on the terminal as well.

A command's run log also takes what is written to file descriptor 2 below Python (Ray's C++
core worker, the processes Ray starts): `<run>/logs/stderr.log`, while `sys.stderr` stays the
terminal. Standalone commands keep the same `logs/` next to their output (`command_log`) and end
with one `summary` table.

Long work (curate, tokenize, training steps, export) shows a live bar with ETA on a terminal;
the bar clears itself when the work ends, so it adds no line. Off a terminal (a pipe, a CI log)
progress goes to the run log only: the console output stays the stage lines
(kiln.platform.progress).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from kiln.platform.progress import PROGRESS_LOGGER, Progress, follow_metrics
from kiln.platform.terminal import live_bars, verbose
from kiln.platform.terminal import state as _state

FULL_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are theirs, not the user's: they reach the terminal only with -v.
LIBRARY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.serve", "ray.tune", "torch", "filelock")


# kiln loggers whose INFO lines the terminal shows: stage start/end and training progress.
CONSOLE_INFO_LOGGERS = frozenset({"kiln", "kiln.training", "kiln.train"})


class _QuietFilter(logging.Filter):
    """Stage lines and training progress; kiln's other warnings; anyone's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in CONSOLE_INFO_LOGGERS:
            return record.levelno >= logging.INFO
        if record.name.startswith("kiln."):
            return record.levelno >= logging.WARNING
        return record.levelno >= logging.ERROR


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes (redirected or captured later)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        if not live_bars:
            super().emit(record)
            return
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            super().emit(record)


# Ray Data's logging without its own terminal handler (see the file); kiln draws the bars.
RAY_DATA_LOGGING = Path(__file__).with_name("ray_data_logging.yaml")


def configure(verbose: bool = False) -> None:
    """Console logging for a `kiln` command (called once by the CLI)."""
    _state["verbose"] = verbose
    _state["command"] = True
    if not verbose:  # read by Ray Data when it configures its loggers (also on Ray's workers)
        os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(RAY_DATA_LOGGING))
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    handler = _StderrHandler(sys.stderr)
    if verbose:
        handler.setFormatter(logging.Formatter(FULL_FORMAT, datefmt="%H:%M:%S"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        handler.addFilter(_QuietFilter())
    logging.basicConfig(level=logging.DEBUG, handlers=[handler], force=True)
    logging.captureWarnings(True)  # warnings.warn -> the `py.warnings` logger -> the run log
    for name in ("urllib3", "matplotlib", "PIL", "asyncio", "fsspec", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


class _RunLogOnly(logging.Filter):
    """On a library logger: its records below ERROR go to the run log only. A logger filter
    survives what Ray does to the logger later (Serve clears its handlers and adds a terminal
    one on `serve.run`, with propagation off)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.FileHandler) and record.levelno >= h.level:
                h.handle(record)
        return False


_RUN_LOG_ONLY = _RunLogOnly()


def route_library_loggers() -> None:
    """Quiet mode: Ray's loggers (which bring their own terminal handlers) write below ERROR to
    the run log only."""
    if verbose():
        return
    # A root handler that is on a library logger too (seen: pytest's capture handlers on `ray`
    # in a test worker) carries every logger's records: never filter it.
    shared = set(logging.getLogger().handlers)
    for name in LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        # on the logger for its own records, on its terminal handlers for its children's
        own = [h for h in lg.handlers if not isinstance(h, logging.FileHandler) and h not in shared]
        for target in [lg, *own]:
            if _RUN_LOG_ONLY not in target.filters:
                target.addFilter(_RUN_LOG_ONLY)


class _RunLog(logging.FileHandler):
    """`<run_dir>/logs/kiln.log`; remembers the `kiln` logger's level to restore on detach,
    and the terminal's file descriptor while native output goes to `stderr.log`."""

    kiln_level = logging.NOTSET
    terminal_fd: int | None = None
    terminal_stream = None


NATIVE_LOG = "stderr.log"


def _native_stderr_to(path: Path, handler: _RunLog) -> None:
    """A `kiln` command in quiet mode: file descriptor 2 -> `path`, `sys.stderr` -> the terminal.

    Ray's C++ core worker in this process (`core_worker.cc: ...` lines), the daemons and
    workers it starts, and any library writing to fd 2 land in the run folder; kiln's console
    lines, bars and errors (through `sys.stderr`) still reach the terminal. Only where
    `sys.stderr` is fd 2 itself (not under a test's capture) and no run log holds it already."""
    if not _state.get("command") or verbose():
        return
    if any(
        isinstance(h, _RunLog) and h.terminal_fd is not None for h in logging.getLogger().handlers
    ):
        return
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):  # a capture object with no descriptor
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 2)
    os.close(target)
    handler.terminal_fd, handler.terminal_stream = terminal, sys.stderr
    sys.stderr = open(  # noqa: SIM115 - closed on detach
        terminal,
        "w",
        buffering=1,
        encoding=sys.stderr.encoding,
        errors="backslashreplace",
        closefd=False,
    )


def _native_stderr_back(handler: _RunLog) -> None:
    if handler.terminal_fd is None:
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        sys.stderr.close()
    os.dup2(handler.terminal_fd, 2)
    os.close(handler.terminal_fd)
    sys.stderr = handler.terminal_stream
    handler.terminal_fd, handler.terminal_stream = None, None


def attach_run_log(run_dir: Path) -> logging.Handler:
    """Every record of this process, full format, to `<run_dir>/logs/kiln.log`. From the SDK
    (no `configure`: the root logger at Python's default WARNING) kiln's own INFO lines, the
    stage lines, would never be made: the `kiln` logger takes INFO while the run lasts."""
    logs = Path(run_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    handler = _RunLog(logs / "kiln.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter(FULL_FORMAT))
    handler.setLevel(logging.DEBUG)
    kiln = logging.getLogger("kiln")
    handler.kiln_level = kiln.level
    if kiln.getEffectiveLevel() > logging.INFO:
        kiln.setLevel(logging.INFO)
    _native_stderr_to(logs / NATIVE_LOG, handler)
    logging.getLogger().addHandler(handler)
    return handler


def run_log_path() -> Path | None:
    """The attached run log's file (the newest, when runs nest), or None."""
    logs = [h for h in logging.getLogger().handlers if isinstance(h, _RunLog)]
    return Path(logs[-1].baseFilename) if logs else None


def detach_run_log(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    if isinstance(handler, _RunLog):
        logging.getLogger("kiln").setLevel(handler.kiln_level)
        _native_stderr_back(handler)
    handler.close()


@contextlib.contextmanager
def command_log(folder: str | os.PathLike):
    """A standalone command's run log, as `kiln run` keeps one: `<folder>/logs/kiln.log`
    (every record), `stderr.log` (native output) and `ray` (linked by the runtime once Ray
    runs: this Ray session's logs)."""
    handler = attach_run_log(Path(folder))
    try:
        yield Path(folder) / "logs"
    finally:
        detach_run_log(handler)


def summary(rows: list[tuple[str, object]], file=None) -> None:
    """A command's result as one aligned table (name, value) on stdout: what a person reads
    instead of a JSON dump (the numbers are in the output folder's own files)."""
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        if value is None:
            value = "-"
        elif isinstance(value, float):
            value = f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        print(f"  {name:<{width}}  {value}", file=file or sys.stdout)


def ranked_counts(counts: dict[str, int]) -> str:
    """`name count, ...`, the largest first (`-` for none): a summary row's value."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {n:,}" for name, n in ranked) or "-"


def link_ray_logs(run_dir: Path) -> None:
    """`<run_dir>/logs/ray` -> this Ray session's log folder (workers' output, Ray Data, Serve).
    Made when Ray starts and again at the end of a run: a run that restarted Ray links the
    latest session."""
    try:
        import ray

        session = ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001
    except Exception:  # noqa: BLE001 - an attached or finished Ray: nothing to link
        return
    link = Path(run_dir) / "logs" / "ray"
    target = Path(session) / "logs"
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.exists() and not link.is_symlink():
        return  # a folder of the user's: left alone
    link.parent.mkdir(parents=True, exist_ok=True)
    fresh = link.with_name(f"ray.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        fresh.unlink()
    fresh.symlink_to(target, target_is_directory=True)
    os.replace(fresh, link)


__all__ = ["PROGRESS_LOGGER", "Progress", "follow_metrics", "verbose"]
