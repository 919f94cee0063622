"""The built-in rewards by name: each a factory `(params, where) -> Reward`, where `where` is the
config path of its params (for error messages)."""

from __future__ import annotations

from collections.abc import Callable

from kiln.training.rl.rewards.code_reward import code
from kiln.training.rl.rewards.format_rewards import json_schema, length_penalty, regex
from kiln.training.rl.rewards.math_answer import math_exact
from kiln.training.rl.rewards.types import Reward

BUILTIN_REWARDS: dict[str, Callable[[dict, str], Reward]] = {
    "math_exact": math_exact,
    "regex": regex,
    "json_schema": json_schema,
    "length_penalty": length_penalty,
    "code": code,
}
