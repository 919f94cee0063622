"""DCP storage writers and readers for a checkpoint folder given as a local path or an fsspec
URI; reading goes through `safe_reader`, so loading never unpickles arbitrary objects."""

from __future__ import annotations

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from kiln.model.formats import storage
from kiln.model.formats.safe_reader import SafeFileSystemReader, safe_fsspec_reader

# DCP gathers the ranks' read/write errors into a CheckpointException, a BaseException
WRITE_ERRORS = (Exception, CheckpointException)


def make_writer(uri: str, thread_count: int = 1):
    if storage.is_local(uri):
        return FileSystemWriter(
            uri.removeprefix("file://"), thread_count=thread_count, sync_files=True
        )
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(uri, thread_count=thread_count, sync_files=True)


def make_reader(uri: str):
    """A DCP reader whose `.metadata` load resolves only DCP's own classes (no arbitrary
    unpickling; `safe_reader`)."""
    if storage.is_local(uri):
        return SafeFileSystemReader(uri.removeprefix("file://"))
    return safe_fsspec_reader(uri)
