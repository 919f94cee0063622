"""The one config loader: a YAML file (or one block of it), `--set a.b=c` overrides, a pydantic
model, and a one-line error naming the file and the field.

    cfg = load_config(TrainStageConfig, "train.yaml", block="train", overrides=["steps=5"],
                      prefix="train")

`kiln run` (the pipeline spec), `kiln train`, `kiln curate` and the torchrun entry all load
their configs here, so a bad file, an unknown field, a wrong type or a bad override reads the
same everywhere: `kiln: error: <file>: <field.path>: <what was expected> (got <value>)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kiln.platform.errors import ConfigError, InputError, format_validation_error

M = TypeVar("M", bound=BaseModel)
# Maps an override key's parts to where it lands in the body (e.g. a stage name -> its config).
Route = Callable[[list[str]], list[str | int]]


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Parse a YAML (or JSON) file; a missing file or bad YAML is one line with line/column."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{path}: {what} file not found")
    try:
        return yaml.safe_load(file.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}:{where} invalid YAML ({problem})") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], c); the value is parsed as YAML (`[1, 2]`, `true`, `3e-4`)."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. --set parallel.tp=2)")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw  # not YAML: the literal string
    return key.split("."), value


def apply_overrides(body: dict[str, Any], overrides: Iterable[str], route: Route | None = None):
    """Set each `a.b=c` in `body` (in place), creating mappings on the way; returns `body`."""
    for item in overrides:
        parts, value = parse_override(item)
        path = route(parts) if route else parts
        node: Any = body
        for i, part in enumerate(path[:-1]):
            nxt = node[part] if isinstance(node, list) else node.setdefault(part, {})
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict | list):
                where = ".".join(map(str, path[: i + 1]))
                raise ConfigError(f"--set {'.'.join(parts)}: {where} is not a mapping")
            node = nxt
        node[path[-1]] = value
    return body


def override_paths(overrides: Iterable[str], route: Route | None = None) -> dict[tuple, str]:
    """Each `--set` item keyed by where it lands in the body, so an error there blames it."""
    paths = {}
    for item in overrides:
        parts, _ = parse_override(item)
        paths[tuple(str(p) for p in (route(parts) if route else parts))] = item
    return paths


def validate(
    model: type[M],
    body: Any,
    *,
    prefix: str = "",
    source: str | Path | None = None,
    overrides: dict[tuple, str] | None = None,
) -> M:
    """`model.model_validate(body)` with the one-line error `<source>: <prefix.field>: ...`
    (`--set ITEM: ...` where an override in `overrides`, from `override_paths`, set the field)."""
    head = f"{source}: " if source else ""
    if not isinstance(body, dict):
        raise ConfigError(f"{head}expected a mapping of {prefix or model.__name__} fields")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise ConfigError(
            format_validation_error(
                e, prefix, model=model, overrides=overrides, source=str(source) if source else None
            )
        ) from None


def reject_pipeline_spec(path: str | Path | None, body: Any) -> None:
    """A pipeline spec handed to a stage command (`kiln train --config quickstart.yaml`)."""
    if isinstance(body, dict) and "pipeline" in body and "stages" in body:
        raise ConfigError(f"{path}: this is a pipeline spec: use `kiln run {path}`")


def load_body(
    path: str | Path | None,
    *,
    block: str | None = None,
    fields: dict[str, Any] | None = None,
    overrides: Iterable[str] = (),
    route: Route | None = None,
    what: str = "config",
) -> dict[str, Any]:
    """The raw mapping `load_config` validates: file (or its `block:`), then fields, then --set."""
    body = read_yaml(path, what) if path else {}
    body = {} if body is None else body
    if what != "spec":
        reject_pipeline_spec(path, body)
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: expected a mapping of {block or what} fields")
    if block and isinstance(body.get(block), dict):
        body = body[block]
    body.update({k: v for k, v in (fields or {}).items() if v is not None})
    return apply_overrides(body, overrides, route)


def load_config(
    model: type[M],
    path: str | Path | None = None,
    *,
    block: str | None = None,
    fields: dict[str, Any] | None = None,
    overrides: Iterable[str] = (),
    prefix: str = "",
    route: Route | None = None,
) -> M:
    """Load `path` (its `block:` mapping when the file has one, else the whole file), add `fields`
    (None values skipped), apply `--set` overrides and validate into `model`."""
    overrides = list(overrides)
    body = load_body(path, block=block, fields=fields, overrides=overrides, route=route)
    paths = override_paths(overrides, route)
    return validate(model, body, prefix=prefix, source=path, overrides=paths)
