"""Pipeline specs in YAML.

    pipeline: demo              # the name; runs go to <runs_dir>/demo/<run-id>/
    runs_dir: runs              # optional (else $KILN_RUNS_DIR or ./runs)
    stages:
      - stage: text.read        # a registered stage name, or package.module:Class
        name: read              # optional, defaults to the stage name
        config: {paths: [docs/]}
      - stage: text.stats
        inputs: {corpus: read.corpus}   # optional: defaults to the latest output of the right kind

`--set read.paths=[a,b]` overrides a stage's config field (values are parsed as YAML);
`--set runs_dir=/tmp/runs` overrides a top-level key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kiln.platform.errors import ConfigError, KilnError, SpecError
from kiln.platform.pipeline import Pipeline
from kiln.platform.registry import stage_class

TOP_LEVEL = {"pipeline", "runs_dir", "stages", "description", "ray"}
STAGE_KEYS = {"stage", "name", "config", "inputs"}


def read_spec(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}:{where}: invalid YAML ({problem})") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: expected a mapping with `pipeline:` and `stages:`")
    return spec


def apply_overrides(spec: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key=value` overrides: `<stage>.<field.path>=v` or a top-level `key=v`."""
    by_name = {_stage_name(s): s for s in spec.get("stages") or [] if isinstance(s, dict)}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        head, _, rest = key.partition(".")
        if head in by_name and rest:
            node = by_name[head].setdefault("config", {})
            parts = rest.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"--set {key}: {p} is not a mapping")
            node[parts[-1]] = value
        elif head in TOP_LEVEL and not rest:
            spec[head] = value
        else:
            names = ", ".join(by_name) or "none"
            raise ConfigError(f"--set {key}: no stage named {head!r} (stages: {names})")
    return spec


def _stage_name(entry: dict[str, Any]) -> str:
    return str(entry.get("name") or entry.get("stage"))


def build_pipeline(
    spec: dict[str, Any], source: str = "spec", runs_dir: str | None = None
) -> Pipeline:
    unknown = set(spec) - TOP_LEVEL
    if unknown:
        raise SpecError(
            f"{source}: unknown key {min(unknown)!r} (expected: {', '.join(sorted(TOP_LEVEL))})"
        )
    name = spec.get("pipeline")
    if not isinstance(name, str):
        raise SpecError(f"{source}: pipeline: expected a name (string)")
    entries = spec.get("stages")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{source}: stages: expected a non-empty list")
    stages = []
    for i, entry in enumerate(entries):
        where = f"{source}: stages[{i}]"
        if not isinstance(entry, dict) or "stage" not in entry:
            raise SpecError(f"{where}: expected a mapping with `stage: <name>`")
        extra = set(entry) - STAGE_KEYS
        if extra:
            raise SpecError(
                f"{where}: unknown key {min(extra)!r} (expected: {', '.join(sorted(STAGE_KEYS))})"
            )
        config = entry.get("config") or {}
        inputs = entry.get("inputs") or {}
        if not isinstance(config, dict):
            raise SpecError(f"{where}.config: expected a mapping")
        if not isinstance(inputs, dict):
            raise SpecError(f"{where}.inputs: expected a mapping of slot: artifact")
        try:
            cls = stage_class(str(entry["stage"]))
        except KilnError as e:
            raise type(e)(f"{where}: {e}") from None
        try:
            stages.append(
                cls(config, name=entry.get("name"), inputs={k: str(v) for k, v in inputs.items()})
            )
        except KilnError as e:
            raise type(e)(f"{source}: {e}") from None
    return Pipeline(name, stages, runs_dir=runs_dir or spec.get("runs_dir"))


def load_pipeline(
    path: str | Path, overrides: list[str] = (), runs_dir: str | None = None
) -> Pipeline:
    spec = apply_overrides(read_spec(path), list(overrides))
    return build_pipeline(spec, source=str(path), runs_dir=runs_dir)
