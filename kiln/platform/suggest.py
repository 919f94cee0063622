""" "did you mean ...?" for a mistyped command, stage or field name (difflib's close matches)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to `word`, if any is close enough to be what was meant."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'steps'?)`, or "" when nothing is close."""
    match = closest(word, choices)
    return f" (did you mean {match!r}?)" if match else ""
