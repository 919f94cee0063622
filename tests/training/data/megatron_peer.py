"""Megatron-Core's dataset code, the peer kiln's data formats are checked against, imported
without `megatron/core/__init__.py`: that file imports Megatron's whole model and optimizer stack
(~6 CPU s here, paid by every test run's collection) although the dataset modules need only
`parallel_state` and `utils`. Pinned to the megatron-core the test extra installs."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings


def _light_megatron_core() -> None:
    if "megatron.core" in sys.modules:
        return
    import megatron

    package = types.ModuleType("megatron.core")
    package.__path__ = [
        importlib.util.find_spec("megatron").submodule_search_locations[0] + "/core"
    ]
    sys.modules["megatron.core"] = package
    megatron.core = package
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        import megatron.core.parallel_state  # noqa: F401 - first: it breaks utils' import cycle


_light_megatron_core()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers_cpp
    from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

__all__ = [
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "_build_document_index",
    "_build_shuffle_index",
    "helpers_cpp",
]
