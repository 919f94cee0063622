"""Stage registry: the names a YAML spec may use.

Built-in stages are listed by import path so that naming a stage imports only its own
module (the CLI stays fast, and a stage whose extra is not installed fails only when used); the
areas' stages are added by the composition root (kiln/stages.py), the platform names no area.
User stages register with `@register_stage("name")` or are named as `package.module:Class`.
"""

from __future__ import annotations

import importlib

from kiln.platform.errors import SpecError
from kiln.platform.imports import import_object
from kiln.platform.stage import Stage
from kiln.platform.suggest import did_you_mean

BUILTIN_STAGES: dict[str, str] = {
    "text.read": "kiln.platform.builtin_stages:TextRead",
    "text.stats": "kiln.platform.builtin_stages:TextStats",
    "noop": "kiln.platform.builtin_stages:Noop",
}

_registered: dict[str, type[Stage]] = {}


def register_builtin_stages(paths: dict[str, str]) -> None:
    """Add built-in stages by import path (`module:Class`), imported when a spec names them."""
    BUILTIN_STAGES.update(paths)


# Named components one area offers another through the composition root, by import path
# (`module:attr`): e.g. evaluation starting serving's endpoint, without importing serving.
_components: dict[str, str] = {}


def register_component(name: str, target: str) -> None:
    _components[name] = target


def component(name: str):
    """The object registered as `name` (imported now); SpecError when nothing provides it."""
    target = _components.get(name)
    if target is None:
        raise SpecError(f"no {name!r} is available (kiln/stages.py registers the built-in ones)")
    return import_object(target)


def register_stage(name: str):
    """Class decorator: make a Stage subclass available to YAML specs under `name`."""

    def wrap(cls: type[Stage]) -> type[Stage]:
        cls.type_name = cls.type_name or name
        _registered[name] = cls
        return cls

    return wrap


def _import(target: str, name: str) -> type[Stage]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise SpecError(f"stage {name!r}: cannot import {module_name} ({e})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise SpecError(f"stage {name!r}: {target} is not a kiln Stage class")
    return cls


def stage_class(name: str) -> type[Stage]:
    """Resolve a stage name from a spec to its class."""
    if name in _registered:
        return _registered[name]
    if name in BUILTIN_STAGES:
        return _import(BUILTIN_STAGES[name], name)
    if ":" in name:
        return _import(name, name)

    hint = did_you_mean(name, available_stages())
    known = ", ".join(public_stages())
    raise SpecError(f"unknown stage {name!r}{hint} (known: {known}; or package.module:Class)")


# Stages for tests and the platform's own checks: usable in a spec, not listed to users.
INTERNAL_STAGES = frozenset({"noop", "text.stats"})


def available_stages() -> list[str]:
    return sorted(set(BUILTIN_STAGES) | set(_registered))


def public_stages() -> list[str]:
    """The stages `kiln stages` and the YAML reference show."""
    return [name for name in available_stages() if name not in INTERNAL_STAGES]
