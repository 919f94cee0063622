"""Rewards named in YAML, combined with weights, scored without ever raising.

A reward is a plain callable `(prompt, completion, row) -> float`. `RewardSpec` names a built-in
(`name: math_exact`) or a user function (`function: my_pkg.rewards:brevity`); `params` go to the
built-in's factory, or as keyword arguments to the user function. A reward that raises scores 0
for that sample and its reason is kept in `RewardResult.failures`: one bad completion (or one
buggy reward) must not end a training run.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kiln.platform.errors import ConfigError, format_validation_error
from kiln.training.rl.rewards.builtins import BUILTIN_REWARDS
from kiln.training.rl.rewards.types import Reward, RewardFailed


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="A built-in reward (see BUILTIN_REWARDS).")
    function: str | None = Field(None, description="A user reward as 'module:function'.")
    weight: float = Field(1.0, description="Its weight in the total reward.")
    params: dict = Field(
        default_factory=dict, description="The built-in's (or function's) options."
    )

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if (self.name is None) == (self.function is None):
            raise ValueError(
                "give exactly one of 'name' (a built-in) or 'function' (module:function)"
            )
        return self

    @property
    def label(self) -> str:
        return self.name or self.function  # type: ignore[return-value]


@dataclass
class RewardResult:
    total: float
    parts: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def _import_function(path: str, where: str) -> Callable:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}: expected 'module:function' (got {path!r})")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError or an error while importing the user's module
        raise ConfigError(f"{where}: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{where}: {module_name!r} has no function {attr!r}")
    return fn


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, RewardFailed):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class RewardSet:
    """Named rewards with weights; `score` never raises for a reward's failure."""

    def __init__(self, rewards: dict[str, Reward], weights: dict[str, float]) -> None:
        self.rewards = rewards
        self.weights = weights

    @classmethod
    def from_specs(
        cls, specs: Sequence[RewardSpec | dict], field_name: str = "rewards"
    ) -> RewardSet:
        if not specs:
            raise ConfigError(f"{field_name}: give at least one reward")
        rewards: dict[str, Reward] = {}
        weights: dict[str, float] = {}
        for i, raw in enumerate(specs):
            where = f"{field_name}[{i}]"
            try:
                spec = raw if isinstance(raw, RewardSpec) else RewardSpec.model_validate(raw)
            except ValidationError as e:
                raise ConfigError(
                    format_validation_error(e, prefix=where, model=RewardSpec)
                ) from None
            if spec.name is not None:
                factory = BUILTIN_REWARDS.get(spec.name)
                if factory is None:
                    raise ConfigError(
                        f"{where}.name: {spec.name!r} is not a built-in reward "
                        f"(expected one of {sorted(BUILTIN_REWARDS)}, "
                        "or 'function: module:function')"
                    )
                fn = factory(spec.params, f"{where}.params")
            else:
                fn = _import_function(spec.function, f"{where}.function")  # type: ignore[arg-type]
                if spec.params:
                    fn = functools.partial(fn, **spec.params)
            label, n = spec.label, 2
            while label in rewards:  # two regex rewards, say: regex, regex_2
                label, n = f"{spec.label}_{n}", n + 1
            rewards[label] = fn
            weights[label] = spec.weight
        return cls(rewards, weights)

    @property
    def names(self) -> list[str]:
        return list(self.rewards)

    def _call(self, label: str, prompt: str, completion: str, row: dict):
        """(value, reason or None): a reward's failure is that sample's 0, never the run's."""
        try:
            value = float(self.rewards[label](prompt, completion, row))
            if not math.isfinite(value):
                raise ValueError(f"reward is {value}")
            return value, None
        except RewardFailed as e:
            return float(e.score), _one_line(e)
        except Exception as e:  # any bug in a reward, any bad completion
            return 0.0, _one_line(e)

    def _result(self, outcomes: dict[str, tuple[float, str | None]]) -> RewardResult:
        parts = {label: outcomes[label][0] for label in self.rewards}
        failures = {k: reason for k, (_, reason) in outcomes.items() if reason is not None}
        total = sum(self.weights[k] * v for k, v in parts.items())
        return RewardResult(total=total, parts=parts, failures=failures)

    def score_one(self, prompt: str, completion: str, row: dict) -> RewardResult:
        return self._result({k: self._call(k, prompt, completion, row) for k in self.rewards})

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[dict],
        max_workers: int | None = None,
    ) -> list[RewardResult]:
        """One result per completion, in order.

        Rewards that wait on a subprocess (`code`) run on a thread pool of `max_workers`
        (default: the CPU count); the others run in this thread, so a user function need not
        be thread-safe."""
        if not (len(prompts) == len(completions) == len(rows)):
            raise ValueError(
                f"score: {len(prompts)} prompts, {len(completions)} completions, {len(rows)} rows"
            )
        samples = list(zip(prompts, completions, rows, strict=True))
        pooled = [k for k, fn in self.rewards.items() if getattr(fn, "runs_subprocess", False)]
        outcomes = [
            {k: self._call(k, *sample) for k in self.rewards if k not in pooled}
            for sample in samples
        ]
        if pooled:
            jobs = [(i, k) for i in range(len(samples)) for k in pooled]
            with ThreadPoolExecutor(max_workers=max_workers or os.cpu_count()) as pool:
                done = pool.map(lambda job: self._call(job[1], *samples[job[0]]), jobs)
                for (i, k), outcome in zip(jobs, done, strict=True):
                    outcomes[i][k] = outcome
        return [self._result(o) for o in outcomes]
