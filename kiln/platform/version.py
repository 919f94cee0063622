"""Kiln's version, as installed (pyproject.toml is its one source)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kiln")
except PackageNotFoundError:  # a source tree on sys.path without an install (a Ray job's copy)
    __version__ = "0+unknown"
