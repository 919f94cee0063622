"""The `code` reward: the completion's Python run against the row's unit tests, sandboxed.

The code is the last ```python (or ```py, or bare ```) block of the completion, or the whole
completion when it has no fence. `row[tests_field]` is a string of asserts (each top-level
assert one test; other statements run first) or a list of test snippets.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from kiln.training.rl.rewards.code_sandbox import SandboxLimits, run_sandboxed
from kiln.training.rl.rewards.params import parse_params
from kiln.training.rl.rewards.types import Reward, RewardFailed

PYTHON_FENCE = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
ANY_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    for fence in (PYTHON_FENCE, ANY_FENCE):
        blocks = fence.findall(completion)
        if blocks:
            return blocks[-1]
    return completion


class CodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tests_field: str = "tests"
    partial: bool = False  # score the fraction of tests passed instead of all-or-nothing
    timeout_s: float = Field(5.0, gt=0)
    cpu_s: int | None = Field(None, gt=0)  # default: the wall timeout, rounded up
    memory_mb: int = Field(512, ge=64)
    file_size_mb: int = Field(8, gt=0)
    output_chars: int = Field(4096, ge=0)


def code(params: dict, where: str) -> Reward:
    p = parse_params(CodeParams, params, where)
    limits = SandboxLimits(
        timeout_s=p.timeout_s,
        cpu_s=p.cpu_s or max(1, int(-(-p.timeout_s // 1))),
        memory_mb=p.memory_mb,
        file_size_mb=p.file_size_mb,
        output_chars=p.output_chars,
    )

    def reward(prompt: str, completion: str, row: dict) -> float:
        tests = row.get(p.tests_field)
        if not isinstance(tests, str | list) or not tests:
            raise ValueError(f"row[{p.tests_field!r}] must be a string of asserts or a list")
        result = run_sandboxed(extract_code(completion), tests, limits)
        if result.ok:
            return 1.0
        refused = result.reason is not None and "refused" in result.reason
        score = result.passed / result.total if p.partial and result.total and not refused else 0.0
        raise RewardFailed(result.reason or "no tests ran", score=score)

    reward.runs_subprocess = True  # type: ignore[attr-defined]  # RewardSet scores it in threads
    return reward
