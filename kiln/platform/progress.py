"""Long work's progress on the console: a live bar with ETA on a terminal that log lines are
written around and that clears itself; off a terminal (a pipe, a CI log) plain lines to the
`kiln.progress` logger, which the quiet console leaves to the run log (kiln.platform.console).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from kiln.platform.terminal import live_bars, verbose

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
            live_bars.append(self._bar)

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
            if bar in live_bars:
                live_bars.remove(bar)
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
