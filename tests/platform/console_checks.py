"""What a quiet `kiln` command may print: kiln's own `HH:MM:SS message` lines on stderr and one
summary table (`  name  value` rows) on stdout; no library output, no JSON dump."""

from __future__ import annotations

import re

KILN_LINE = re.compile(r"^\d\d:\d\d:\d\d \S")
TABLE_ROW = re.compile(r"^  \S.*\S  +\S")


def assert_quiet(stdout: str, stderr: str) -> dict[str, str]:
    """Fails on any other line; returns the summary table as {name: value}."""
    noisy = [line for line in stderr.splitlines() if line and not KILN_LINE.match(line)]
    assert not noisy, "\n".join(noisy[:20])
    rows = stdout.splitlines()
    assert rows, "no summary table"
    assert all(TABLE_ROW.match(line) for line in rows), stdout
    assert "{" not in stdout
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in rows)
