"""Loading a DCP checkpoint without unpickling arbitrary objects. Torch's own reader and planner
unpickle twice: `read_metadata` reads `.metadata` with plain `pickle.load`, and `load_bytes` reads
every non-tensor item with `torch.load(weights_only=False)`. Here `.metadata` goes through an
unpickler that resolves only DCP's metadata classes, torch sizes/dtypes/layouts and plain
containers, and non-tensor items through `torch.load(weights_only=True)`; anything else is a
one-line `InputError`. Tensor data DCP already reads with `weights_only=True`."""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from kiln.platform.errors import InputError

_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_BUILTINS = {
    ("builtins", n) for n in ("set", "frozenset", "tuple", "list", "dict", "slice", "getattr")
} | {
    ("copyreg", "_reconstructor"),
    ("copyreg", "__newobj__"),
    ("builtins", "object"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
    ("torch.serialization", "_get_layout"),  # how torch.layout pickles
}
_TORCH_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _MODULES or (module, name) in _BUILTINS:
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, _TORCH_TYPES):
                return obj
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_metadata(stream) -> Metadata:
    try:
        metadata = _MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as exc:
        raise InputError(f"checkpoint .metadata: {exc} (not a DCP metadata file)") from None
    if not isinstance(metadata, Metadata):
        raise InputError(f"checkpoint .metadata holds a {type(metadata).__name__}, not Metadata")
    return metadata


class _SafeMetadata:
    """`read_metadata` as torch's, with the restricted unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeFileSystemReader(_SafeMetadata, FileSystemReader):
    pass


def safe_fsspec_reader(uri: str):
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    class SafeFsspecReader(_SafeMetadata, FsspecReader):
        pass

    return SafeFsspecReader(uri)


def _load_bytes(self, read_item, value) -> None:
    """DCP's `load_bytes` with `weights_only=True`: its default unpickles each non-tensor item
    (train step, scheduler state, kiln's JSON blobs) with `torch.load(weights_only=False)`."""
    try:
        obj = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"checkpoint item {read_item.dest_index.fqn}: refused ({first})") from None
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
    else:
        self.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(DefaultLoadPlanner):
    load_bytes = _load_bytes


class SafeKeysLoadPlanner(_EmptyStateDictLoadPlanner):
    """Rebuilds the state dict of `keys` from the metadata (offline loads), safely."""

    load_bytes = _load_bytes
