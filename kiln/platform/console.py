"""What a `kiln` command prints, and where everything else goes.

Quiet (the default): the terminal shows kiln's own INFO lines (a stage's start and end, the
trainer's progress) in a short `HH:MM:SS message` form, warnings and errors from anyone, and the
final table. Ray's, Ray Data's, Ray Train's and Serve's output, Python warnings and debug lines
go to `<run>/logs/kiln.log` (every record, full format) and Ray's own session logs, which
`<run>/logs/ray` links to. `-v` (verbose) prints all of it on the terminal as well.

Long work (curate, tokenize, training steps, export) shows a live bar with ETA on a terminal;
the bar clears itself when the work ends, so it adds no line. Off a terminal (a pipe, a CI log)
progress goes to the run log only: the console output stays the stage lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

FULL_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_state = {"verbose": False}
# Libraries whose INFO lines are theirs, not the user's: they reach the terminal only with -v.
LIBRARY_LOGGERS = ("ray", "ray.data", "ray.train", "ray.serve", "ray.tune", "torch", "filelock")


def verbose() -> bool:
    return _state["verbose"]


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


# Live progress bars on the terminal: a log line is written around them (clear, write, redraw).
_live_bars: list = []


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes (redirected or captured later)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        if not _live_bars:
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


# Progress off a terminal: run log only in quiet mode (a kiln.* logger below WARNING), shown by -v.
PROGRESS_LOGGER = "kiln.progress"


class Progress:
    """Long work's progress: a live bar with ETA on a terminal (quiet mode), cleared when it
    closes; elsewhere one plain line at most every `every_s` seconds (and at the end) to the
    `kiln.progress` logger, which the quiet terminal leaves to the run log.

        with Progress(len(tasks), "curate", unit="tasks") as progress:
            for task in tasks:
                ...
                progress.advance(1, f"{documents} documents")
    """

    delay_s = 0.5  # before a bar appears: work shorter than that draws nothing
    refresh_s = 0.25  # between redraws

    def __init__(
        self, total: int, desc: str, unit: str = "it", every_s: float = 15.0, scale: bool = False
    ) -> None:
        """`scale`: counts shown with k/M/G prefixes (bytes: unit="B")."""
        import time

        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.scale = scale
        self.done, self._t0, self._last = 0, time.monotonic(), 0.0
        self._bar = None
        if sys.stderr.isatty() and not verbose():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                # count, unit, elapsed<ETA, postfix (no rate: "1.00s/tasks" reads badly)
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                + unit
                + " [{elapsed}<{remaining}{postfix}]",
                leave=False,
                unit_scale=scale,
                unit_divisor=1024 if scale and unit == "B" else 1000,
                dynamic_ncols=True,
                file=sys.stderr,
                delay=self.delay_s,
                mininterval=self.refresh_s,
            )
            _live_bars.append(self._bar)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def advance(self, n: int = 1, postfix: str = "") -> None:
        self.update(self.done + n, postfix)

    def update(self, done: int, postfix: str = "") -> None:
        import time

        step, self.done = done - self.done, done
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(step)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or done >= self.total:
            self._last = now
            logging.getLogger(PROGRESS_LOGGER).info(
                "%s: %s/%s %s%s, ETA %s",
                self.desc,
                self._count(done),
                self._count(self.total),
                self.unit,
                f" ({postfix})" if postfix else "",
                self._eta(now),
            )

    def _count(self, n: int) -> str:
        if not self.scale:
            return str(n)
        from tqdm import tqdm

        return tqdm.format_sizeof(n, divisor=1024 if self.unit == "B" else 1000)

    def _eta(self, now: float) -> str:
        if not self.done:
            return "?"
        s = int((now - self._t0) / self.done * max(self.total - self.done, 0))
        return f"{s // 60}:{s % 60:02d}"

    def close(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            if bar in _live_bars:
                _live_bars.remove(bar)
            bar.close()


class follow_metrics:  # noqa: N801 - used as a context manager, like contextlib's
    """Progress of a training job running elsewhere (Ray Train workers, whose own lines stay in
    their logs in quiet mode), read from the metrics JSONL its rank 0 appends to per step."""

    def __init__(self, path: str, total_steps: int, desc: str) -> None:
        import threading

        self.path, self.progress = Path(path), None
        self.total, self.desc = total_steps, desc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True, name="kiln-progress")

    def __enter__(self) -> follow_metrics:
        if not verbose():
            self.progress = Progress(self.total, self.desc, unit="steps")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self.progress.close()

    def _follow(self) -> None:
        import json

        offset, stopped = 0, False
        while not stopped:
            stopped = self._stop.wait(1.0)  # once more after the stop: the last steps' rows
            if not self.path.is_file():
                continue
            with open(self.path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written: next time
            offset += len(complete)
            for line in complete.splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                loss = row.get("loss")
                self.progress.update(
                    int(row.get("step", 0)), f"loss {loss:.3f}" if loss is not None else ""
                )
