"""The stage contract: a pydantic config, named input/output artifacts, `run(ctx)`, a fingerprint.

A stage subclass declares

    class Tokenize(Stage):
        type_name = "tokenize"                      # the name YAML uses
        Config = TokenizeConfig                     # a StageConfig (pydantic, unknown fields rejected)
        input_kinds = {"corpus": "Corpus"}          # slot -> artifact kind
        output_kinds = {"tokens": "TokenDataset", "tokenizer": "Tokenizer"}

        def run(self, ctx: StageContext) -> dict:   # returns metrics for run.json
            corpus_dir = ctx.inputs["corpus"].path
            out = ctx.outputs["tokens"]            # an Artifact whose directory exists and is empty
            ...write files under out.path...
            out.counts = {"documents": n, "tokens": t}
            return {"tokens_per_s": ...}

The pipeline commits every output (writes `artifact.json`) only after `run` returns, so an
interrupted stage never leaves an output a later run would trust.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kiln.platform.artifact import Artifact
from kiln.platform.errors import ConfigError, format_validation_error

if TYPE_CHECKING:
    from kiln.platform.runtime import Runtime


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
                raise ConfigError(format_validation_error(e, f"{self.name}")) from None
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

    def extra_fingerprint(self) -> str:
        """State outside the config that changes the outputs (e.g. input files' sizes and mtimes)."""
        return ""

    def fingerprint(self, input_fingerprints: dict[str, str]) -> str:
        from kiln import __version__

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


@dataclass
class StageContext:
    """What a running stage sees: its inputs, its (uncommitted) outputs, its folder, the runtime."""

    stage: Stage
    run_dir: Path
    stage_dir: Path
    inputs: dict[str, Artifact]
    outputs: dict[str, Artifact]
    runtime: Runtime
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("kiln"))

    def ray(self):
        """Connect to (or start) Ray; returns the runtime. Stages that need no Ray never pay for it."""
        self.runtime.ensure()
        return self.runtime
