"""User-facing errors. The CLI prints `kiln: error: <message>` and exits 2 for any KilnError."""


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


def format_validation_error(exc, prefix: str = "") -> str:
    """One line from a pydantic ValidationError: `field.path: what was expected (got X)`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        where = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        got = err.get("input")
        got_s = "" if err.get("type") in ("missing", "extra_forbidden") else f" (got {got!r})"
        parts.append(f"{where}: {msg}{got_s}")
    return "; ".join(parts)
