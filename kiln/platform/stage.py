"""The stage contract: a pydantic config, named input/output artifacts, `run(ctx)`, a fingerprint.

A stage subclass declares

    class Tokenize(Stage):
        type_name = "tokenize"                      # the name YAML uses
        Config = TokenizeConfig                     # a StageConfig (pydantic, extra="forbid")
        input_kinds = {"corpus": "Corpus"}          # slot -> artifact kind
        output_kinds = {"tokens": "TokenDataset", "tokenizer": "Tokenizer"}

        resources = Resources(ray=True)             # what the platform starts before `run`

        def run(self, ctx: StageContext) -> dict:   # returns metrics for run.json
            corpus_dir = ctx.inputs["corpus"].path
            out = ctx.outputs["tokens"]            # an Artifact whose directory exists and is empty
            ...write files under out.path...
            out.counts = {"documents": n, "tokens": t}
            return {"tokens_per_s": ...}

The pipeline commits every output (writes `artifact.json`) only after `run` returns, so an
interrupted stage never leaves an output a later run would trust.

A stage whose parts need different resources returns several `Step`s from `steps()` (the curator:
Ray Data streaming, then dedup on Dask threads); the platform starts Ray before a step that
declares `ray=True` and shuts an embedded Ray down before one that declares `ray=False`.
State that must survive a failed attempt (checkpoints to resume from) goes to `ctx.work_dir`,
a folder the platform keys by the stage's fingerprint and removes once the stage succeeds.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kiln.platform.artifact import Artifact
from kiln.platform.errors import ConfigError, format_validation_error
from kiln.platform.runtime import Resources, Runtime
from kiln.platform.version import __version__


class StageConfig(BaseModel):
    """Base for stage configs: typed, documented fields; unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Stage:
    """One step of a pipeline. Subclasses set the class attributes and implement `run`."""

    type_name: ClassVar[str] = ""
    Config: ClassVar[type[StageConfig]] = StageConfig
    input_kinds: ClassVar[dict[str, str]] = {}
    output_kinds: ClassVar[dict[str, str]] = {}
    optional_inputs: ClassVar[frozenset[str]] = frozenset()
    # False for stages whose effect is outside their outputs (a running endpoint): never skipped.
    cacheable: ClassVar[bool] = True
    # What `run` needs from the runtime (Ray or not, CPUs, GPUs); see `Resources`.
    resources: ClassVar[Resources] = Resources()

    def __init__(
        self,
        config: StageConfig | dict[str, Any] | None = None,
        *,
        name: str | None = None,
        inputs: dict[str, str] | None = None,
        **fields: Any,
    ) -> None:
        self.name = name or self.type_name or type(self).__name__.lower()
        if isinstance(config, StageConfig):
            self.config = config.model_copy(update=fields) if fields else config
        else:
            try:
                self.config = self.Config.model_validate({**(config or {}), **fields})
            except ValidationError as e:
                raise ConfigError(
                    format_validation_error(e, self.name, model=self.Config)
                ) from None
        unknown = set(inputs or {}) - set(self.input_kinds)
        if unknown:
            raise ConfigError(
                f"{self.name}.inputs: unknown slot {min(unknown)!r} "
                f"(expected one of {sorted(self.input_kinds)})"
            )
        # slot -> reference: "<stage>.<slot>" of an earlier stage, or a path to an existing artifact
        self.inputs: dict[str, str] = dict(inputs or {})

    def run(self, ctx: StageContext) -> dict[str, Any] | None:
        raise NotImplementedError

    def needs(self) -> Resources:
        """What `run` needs; override when it depends on the config (default: `resources`)."""
        return self.resources

    def preflight(self, runtime: Runtime, wired: frozenset[str]) -> None:
        """Checks that need no inputs and no work done, run for every stage before the first
        starts, so a mistake in a late stage fails the run at once (raise a KilnError).
        `runtime.planned_resources()` tells what Ray will hold; `wired`: the input slots that
        will be filled (their artifacts may not exist yet)."""

    def steps(self) -> list[Step]:
        """The parts the platform runs in order, each with its resources (default: `run`)."""
        return [Step(self.name, self.needs(), self.run)]

    def extra_fingerprint(self) -> str:
        """State outside the config that changes the outputs (input files' sizes, mtimes)."""
        return ""

    def fingerprint(self, input_fingerprints: dict[str, str]) -> str:
        body = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}",
            "config": self.config.model_dump(mode="json"),
            "inputs": dict(sorted(input_fingerprints.items())),
            "extra": self.extra_fingerprint(),
            "kiln": __version__,
        }
        blob = json.dumps(body, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


@dataclass(frozen=True)
class Step:
    """One part of a stage: a name (for logs and errors), its resources, and the callable."""

    name: str
    needs: Resources
    run: Callable[[StageContext], dict[str, Any] | None]


def needs_ray(stage: Stage) -> bool:
    """Whether any step of `stage` declares it needs Ray (the runtime keeps Ray up for it)."""
    return any(step.needs.ray for step in stage.steps())


def run_steps(stage: Stage, ctx: StageContext) -> dict[str, Any]:
    """Run a stage's steps, starting or releasing Ray before each; returns the merged metrics."""
    metrics: dict[str, Any] = {}
    for step in stage.steps():
        ctx.runtime.provide(step.needs, who=stage.name)
        metrics.update(step.run(ctx) or {})
    return metrics


@dataclass
class StageContext:
    """What a running stage sees: its inputs, its (uncommitted) outputs, its folder, a work
    folder that survives a failed attempt (`work_dir`), the runtime."""

    stage: Stage
    run_dir: Path
    stage_dir: Path
    inputs: dict[str, Artifact]
    outputs: dict[str, Artifact]
    runtime: Runtime
    work_dir: Path | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("kiln"))

    def ray(self):
        """Connect to (or start) Ray; returns the runtime. A stage needing no Ray never pays."""
        self.runtime.ensure()
        return self.runtime
