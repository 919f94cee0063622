"""Final-answer extraction as common GSM8K graders do it, and the `math_exact` reward.

The answer is taken from, in order: the last `\\boxed{...}`, the text after the last `####`
(GSM8K's marker) or the last "answer:" / "answer is" (the first number on that line), or else the
last number in the text (lm-evaluation-harness's "flexible-extract"). Thousands separators, `$`
and a trailing period are dropped; numbers compare by value, so "1,000.0" matches "1000".
"""

from __future__ import annotations

import re
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from kiln.training.rl.rewards.params import parse_params
from kiln.training.rl.rewards.types import Reward, RewardFailed

NUMBER = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
ANSWER_MARKER = re.compile(r"\banswer\b(?:\s+is)?\s*[:=]?", re.IGNORECASE)


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(text.replace("\u2212", "-"))


def _last_number(text: str) -> str | None:
    found = _numbers(text)
    return found[-1] if found else None


def _first_number_after(text: str, end: int) -> str | None:
    """The first number on the line that starts at `end` (after an answer marker)."""
    found = _numbers(text[end:].split("\n")[0])
    return found[0] if found else None


def extract_answer(text: str) -> str | None:
    """The final answer's number as written (e.g. "-1,234.5"), or None if there is none."""
    boxed = _boxed(text)
    if boxed is not None:
        frac = re.fullmatch(r"\s*(-?)\\d?frac\{(-?\d+)\}\{(\d+)\}\s*", boxed)
        if frac:
            return f"{frac[1]}{frac[2]}/{frac[3]}"
        return _last_number(boxed)
    if "####" in text:
        after = _first_number_after(text, text.rindex("####") + 4)
        if after is not None:
            return after
    markers = list(ANSWER_MARKER.finditer(text))
    if markers:
        after = _first_number_after(text, markers[-1].end())
        if after is not None:
            return after
    return _last_number(text)


def to_number(text: str) -> Fraction | None:
    """A number as written in an answer, exactly (Fraction), or None."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace("\u2212", "-").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def reference_answer(value) -> Fraction | None:
    """The row's answer: a number, or a string that is one (a full GSM8K solution included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Fraction(value)
    if isinstance(value, str):
        exact = to_number(value)
        if exact is not None:
            return exact
        found = extract_answer(value)
        return to_number(found) if found is not None else None
    return None


class MathExactParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    field: str = "answer"  # the row field holding the reference answer
    tolerance: float = 0.0  # absolute; 0 compares exactly


def math_exact(params: dict, where: str) -> Reward:
    p = parse_params(MathExactParams, params, where)

    def reward(prompt: str, completion: str, row: dict) -> float:
        if p.field not in row:
            raise KeyError(f"row has no {p.field!r} field")
        expected = reference_answer(row[p.field])
        if expected is None:
            raise ValueError(f"row[{p.field!r}] = {row[p.field]!r} is not a number")
        found = extract_answer(completion)
        got = to_number(found) if found is not None else None
        if got is None:
            raise RewardFailed("no number in the completion")
        if abs(float(got - expected)) <= p.tolerance:
            return 1.0
        return 0.0

    return reward
