"""User-facing errors. The CLI prints `kiln: error: <message>` and exits 2 for any KilnError."""

from kiln.platform.fields import submodel
from kiln.platform.suggest import did_you_mean


class KilnError(Exception):
    """A problem the user can fix: the message names the field or file and what was expected."""


class SpecError(KilnError):
    """A pipeline spec is malformed (bad YAML, unknown stage, bad wiring)."""


class ConfigError(KilnError):
    """A config field has the wrong type, an unknown name or a bad value."""


class InputError(KilnError):
    """An input file or artifact is missing or unreadable."""


class StageFailed(KilnError):
    """A stage raised; the run directory records where."""


def _field_names_at(model, path) -> list[str]:
    """The field names (and aliases) of the pydantic model found at `path` under `model`."""

    for part in path:
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None
        )
        if field is None:  # a list index or a dict key: the item's model is the same
            continue
        model = submodel(field.annotation)
        if model is None:
            return []
    return [n for name, f in model.model_fields.items() for n in {name, f.alias or name}]


def format_validation_error(
    exc, prefix: str = "", model=None, overrides=None, source: str | None = None
) -> str:
    """One line from a pydantic ValidationError: `field.path: what was expected (got X)`.

    With `model`, an unknown field gets "did you mean" its nearest sibling; `overrides` maps a
    field path (a tuple of `model`'s keys) to the `--set` item that put it there, which then
    takes the blame instead of `source` (the file, which prefixes the other errors)."""

    blamed, parts = [], []
    for err in exc.errors():
        loc = tuple(str(p) for p in err.get("loc", ()))
        where = ".".join(x for x in (prefix, ".".join(loc)) if x)
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
            if model is not None and loc:
                msg += did_you_mean(loc[-1], _field_names_at(model, loc[:-1]))
        got = err.get("input")
        got_s = "" if err.get("type") in ("missing", "extra_forbidden") else f" (got {got!r})"
        path = next((path for path in (overrides or {}) if _covers(path, loc)), None)
        if path is not None:
            inside = ".".join(loc[len(path) :])  # the field under a mapping the --set gave
            blamed.append(f"--set {overrides[path]}: {inside + ': ' if inside else ''}{msg}{got_s}")
        else:
            parts.append(f"{where}: {msg}{got_s}")
    head = f"{source}: " if source and parts else ""
    return "; ".join([*blamed, *([head + "; ".join(parts)] if parts else [])])


def _covers(override_path: tuple, loc: tuple) -> bool:
    """Whether the error at `loc` is about the value an override at `override_path` set."""
    n = min(len(override_path), len(loc))
    return n > 0 and override_path[:n] == loc[:n]
