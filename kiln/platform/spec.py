"""Pipeline specs in YAML.

    pipeline: demo              # the name; runs go to <runs_dir>/demo/<run-id>/
    runs_dir: runs              # optional (else $KILN_RUNS_DIR or ./runs); a local folder
    ray: {num_cpus: 4}          # optional: the embedded Ray's size, or `address:` of a cluster
    stages:
      - stage: text.read        # a registered stage name, or package.module:Class
        name: read              # optional, defaults to the stage name
        config: {paths: [docs/]}
      - stage: text.stats
        inputs: {corpus: read.corpus}   # optional: defaults to the latest output of the right kind

`--set read.paths=[a,b]` overrides a stage's config field (values are parsed as YAML);
`--set runs_dir=/tmp/runs` or `--set ray.num_cpus=2` overrides a top-level key.
The file is read, overridden and validated by the one config loader (kiln.platform.config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiln.platform.config import load_body, override_paths, validate
from kiln.platform.errors import ConfigError, KilnError, SpecError, format_validation_error
from kiln.platform.pipeline import Pipeline
from kiln.platform.registry import stage_class
from kiln.platform.runtime import RayConfig
from kiln.platform.suggest import did_you_mean


class StageEntry(BaseModel):
    """One `stages:` item."""

    model_config = ConfigDict(extra="forbid")

    stage: str = Field(description="A registered stage name, or package.module:Class.")
    name: str | None = Field(None, description="Defaults to the stage name.")
    config: dict[str, Any] = Field(default_factory=dict, description="The stage's config fields.")
    inputs: dict[str, str] = Field(
        default_factory=dict, description="slot: <stage>.<slot> of an earlier stage, or a path."
    )

    @property
    def stage_name(self) -> str:
        return self.name or self.stage


class PipelineSpec(BaseModel):
    """A whole spec file."""

    model_config = ConfigDict(extra="forbid")

    pipeline: str = Field(description="The pipeline's name (its runs folder).")
    description: str = ""
    runs_dir: str | None = Field(None, description="Where runs are kept (a local folder).")
    ray: RayConfig = Field(default_factory=RayConfig)
    stages: list[StageEntry] = Field(min_length=1)


TOP_LEVEL = set(PipelineSpec.model_fields)


def _route(body: dict[str, Any]):
    """`<stage>.<field...>` -> stages[i].config.<field...>; top-level keys (`ray.num_cpus`) stay."""
    entries = body.get("stages") if isinstance(body.get("stages"), list) else []
    index = {
        str(e.get("name") or e.get("stage")): i
        for i, e in enumerate(entries)
        if isinstance(e, dict)
    }

    def route(parts: list[str]) -> list[str | int]:
        if ".".join(parts) in index:
            key = ".".join(parts)
            raise ConfigError(
                f"--set {key}: name a field of stage {key!r} (--set {key}.FIELD=VALUE)"
            )
        for cut in range(len(parts) - 1, 0, -1):  # stage names may hold dots: `text.stats.x`
            name = ".".join(parts[:cut])
            if name in index:
                return ["stages", index[name], "config", *parts[cut:]]
        head = parts[0]
        if head in TOP_LEVEL and head != "stages":
            return parts
        names = ", ".join(index) or "none"
        hint = did_you_mean(head, [*index, *(TOP_LEVEL - {"stages"})])
        raise ConfigError(
            f"--set {'.'.join(parts)}: no stage named {head!r}{hint} (stages: {names})"
        )

    return route


def _read_spec(path: str | Path, overrides: list[str]) -> tuple[PipelineSpec, dict[tuple, str]]:
    """The validated spec, and each override keyed by where it landed."""
    try:
        raw = load_body(path, what="spec")
    except KilnError as e:
        raise SpecError(str(e)) from None
    body = load_body(None, fields=raw, overrides=overrides, route=_route(raw))
    paths = override_paths(overrides, _route(raw))
    try:
        return validate(PipelineSpec, body, source=path, overrides=paths), paths
    except ConfigError as e:
        raise SpecError(str(e)) from None


def _stage_config(cls, entry: StageEntry, source: str, overrides: dict[tuple, str]):
    """`entry.config` validated by its stage; an error a `--set` caused is blamed on it."""
    try:
        return cls.Config.model_validate(entry.config)
    except ValidationError as e:
        raise ConfigError(
            format_validation_error(
                e, entry.stage_name, model=cls.Config, overrides=overrides, source=source
            )
        ) from None


def build_pipeline(
    spec: PipelineSpec | dict[str, Any],
    source: str = "spec",
    runs_dir: str | None = None,
    overrides: dict[tuple, str] | None = None,
) -> Pipeline:
    """The pipeline of a spec; `overrides` (from `override_paths`) are blamed for their errors."""
    if not isinstance(spec, PipelineSpec):
        try:
            spec = validate(PipelineSpec, spec, source=source)
        except ConfigError as e:
            raise SpecError(str(e)) from None
    stages = []
    for i, entry in enumerate(spec.stages):
        try:
            cls = stage_class(entry.stage)
        except KilnError as e:
            raise type(e)(f"{source}: stages[{i}]: {e}") from None
        mine = {
            path[3:]: item
            for path, item in (overrides or {}).items()
            if path[:3] == ("stages", str(i), "config")
        }
        config = _stage_config(cls, entry, source, mine)
        try:
            stages.append(cls(config, name=entry.name, inputs=entry.inputs))
        except KilnError as e:
            raise type(e)(f"{source}: {e}") from None
    return Pipeline(spec.pipeline, stages, runs_dir=runs_dir or spec.runs_dir, ray=spec.ray)


def load_pipeline(
    path: str | Path, overrides: list[str] = (), runs_dir: str | None = None
) -> Pipeline:
    spec, paths = _read_spec(path, list(overrides))
    pipeline = build_pipeline(spec, source=str(path), runs_dir=runs_dir, overrides=paths)
    pipeline.spec_source, pipeline.overrides = str(Path(path).resolve()), list(overrides)
    return pipeline
