"""Optional extras (`pip install 'kiln[NAME]'`): a feature that needs one checks for its packages
before any work starts and stops with one line naming the extra, not an ImportError mid-run."""

from __future__ import annotations

import importlib.util

from kiln.platform.errors import KilnError


class MissingExtraError(KilnError):
    """A feature needs packages that only an extra installs."""


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require_extra(extra: str, modules: tuple[str, ...], what: str) -> None:
    """Raise MissingExtraError when any of `modules` cannot be imported; `what` names the
    feature (a command, a stage field) for the one-line message."""
    missing = missing_modules(modules)
    if missing:
        raise MissingExtraError(
            f"{what} needs the `{extra}` extra: pip install 'kiln[{extra}]' "
            f"(not installed: {', '.join(missing)})"
        )
