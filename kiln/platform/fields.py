"""What a pydantic field holds: the config model inside its annotation, for walking a config's
nested fields (the YAML reference, "did you mean" on a nested field)."""

from __future__ import annotations

import inspect
import typing

from pydantic import BaseModel


def submodel(tp) -> type[BaseModel] | None:
    """The pydantic model a field holds (itself, or inside `X | None`, `list[X]`), if any."""
    candidates = [tp, *typing.get_args(tp)]
    for c in candidates:
        if inspect.isclass(c) and issubclass(c, BaseModel):
            return c
    return None
