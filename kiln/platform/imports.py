"""Objects named by import path (`package.module:attr`): how the composition root wires stages,
commands and components together without importing every area up front."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(target: str) -> Any:
    """The object `target` ("module:attr") names, importing its module now."""
    module_name, sep, attr = target.partition(":")
    if not sep or not attr:
        raise ValueError(f"{target!r} is not a 'module:attr' import path")
    return getattr(importlib.import_module(module_name), attr)


def lazy_exports(package: str, exports: dict[str, str]):
    """A package's `__getattr__` (PEP 562) that imports each public name from its import path on
    first use, as vLLM's package does: `from kiln.curator import curate` works, while the
    command line, which imports the package for its parsers, does not load Dask or torch."""

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return import_object(target)

    return __getattr__
