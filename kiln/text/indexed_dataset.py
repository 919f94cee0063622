"""Megatron-LM's indexed dataset: `<prefix>.bin` (tokens) + `<prefix>.idx` (the index).

The `.idx` layout, byte for byte what `megatron.core.datasets.indexed_dataset` writes:

    b"MMIDIDX\\x00\\x00"        9-byte magic
    <Q version = 1
    <B dtype code             (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                               7 float32, 8 uint16)
    <Q sequence count  N
    <Q document count  D + 1  (length of the document index, which starts with 0)
    int32[N]  sequence lengths (tokens)
    int64[N]  sequence pointers (byte offsets into .bin)
    int64[D+1] document index (sequence index where each document ends; [0, ...])

Kiln writes one sequence per document (as Megatron's preprocess_data does), so sequence i is
document i, for pretraining data; chat data groups sequences (conversations) into documents (a
packed row, or a preference pair) with `add_sequence` + `end_document`. Writers stream tokens to
`.bin` and keep only the lengths in memory; shards written in parallel are merged by
concatenating their `.bin` files and offsetting their indices.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Self

import numpy as np

from kiln.platform.errors import InputError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 9 + 8 + 1 + 8 + 8
DTYPE_CODES: dict[int, type[np.number]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_CODES.items()}


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype for token ids, as Megatron's `DType.optimal_dtype` chooses."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def bin_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.bin"


def idx_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.idx"


def exists(prefix: str | os.PathLike) -> bool:
    return os.path.isfile(bin_path(prefix)) and os.path.isfile(idx_path(prefix))


def write_index(
    path: str | os.PathLike,
    dtype: np.dtype,
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
) -> None:
    """Write a `.idx` file; pointers are derived from the lengths and the dtype size."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    doc_index = np.asarray(document_index, dtype=np.int64)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", CODE_OF_DTYPE[np.dtype(dtype)]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_index.tobytes(order="C"))


class IndexedDatasetWriter:
    """Streams documents to `<prefix>.bin` and writes `<prefix>.idx` on `finalize()`."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type = np.uint16) -> None:
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(bin_path(self.prefix), "wb")  # noqa: SIM115 - closed in finalize()
        self._lengths: list[int] = []
        self._document_index: list[int] = [0]  # sequence index where each document ends
        self.num_tokens = 0

    def add_sequence(self, tokens) -> None:
        """One sequence of the current document (close the document with `end_document`)."""
        arr = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._lengths.append(len(arr))
        self.num_tokens += len(arr)

    def end_document(self) -> None:
        """Close the current document: the sequences added since the last one form it."""
        self._document_index.append(len(self._lengths))

    def add_document(self, tokens) -> None:
        """A document of one sequence (what pretraining data holds)."""
        self.add_sequence(tokens)
        self.end_document()

    @property
    def num_documents(self) -> int:
        return len(self._document_index) - 1

    def finalize(self) -> None:
        self._bin.close()
        if self._document_index[-1] != len(self._lengths):
            self.end_document()  # sequences added after the last end_document()
        write_index(
            idx_path(self.prefix),
            self.dtype,
            np.array(self._lengths, np.int32),
            np.array(self._document_index, np.int64),
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self._bin.close()


class IndexedDataset:
    """Read-only, memory-mapped view of `<prefix>.bin/.idx` (Megatron's or kiln's)."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        if not exists(self.prefix):
            raise InputError(
                f"{self.prefix}: no indexed dataset here (expected {self.prefix}.bin and .idx)"
            )
        path = idx_path(self.prefix)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
        if len(head) < HEADER_BYTES or head[:9] != MAGIC:
            raise InputError(f"{path}: not a Megatron indexed-dataset index (bad MMIDIDX header)")
        version, code, n_seq, n_doc = struct.unpack("<QBQQ", head[9:])
        if version != VERSION:
            raise InputError(f"{path}: index version {version}, expected {VERSION}")
        if code not in DTYPE_CODES:
            raise InputError(f"{path}: unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        index = np.memmap(path, mode="r", dtype=np.uint8)
        off = HEADER_BYTES
        self.sequence_lengths = np.frombuffer(index, np.int32, n_seq, off)
        off += 4 * n_seq
        self.sequence_pointers = np.frombuffer(index, np.int64, n_seq, off)
        off += 8 * n_seq
        self.document_indices = np.frombuffer(index, np.int64, n_doc, off)
        nbytes = os.path.getsize(bin_path(self.prefix))
        # An empty .bin cannot be memory-mapped; an empty array reads the same.
        self.tokens = (
            np.memmap(bin_path(self.prefix), mode="r", dtype=self.dtype)
            if nbytes
            else np.zeros(0, dtype=self.dtype)
        )

    def __len__(self) -> int:
        """Number of sequences (= documents when written by kiln or preprocess_data)."""
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    @property
    def token_offsets(self) -> np.ndarray:
        """Start of each sequence in tokens (pointers are in bytes)."""
        return self.sequence_pointers // self.dtype.itemsize

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence `idx` from `offset`, `length` of them (all by default)."""
        start = int(self.sequence_pointers[idx]) // self.dtype.itemsize + offset
        n = int(self.sequence_lengths[idx]) - offset if length is None else length
        return self.tokens[start : start + n]

    def __getitem__(self, idx: int) -> np.ndarray:
        return self.get(idx)

    def document(self, doc: int) -> np.ndarray:
        """All tokens of document `doc` (its sequences concatenated)."""
        lo, hi = int(self.document_indices[doc]), int(self.document_indices[doc + 1])
        if hi == lo:
            return np.zeros(0, self.dtype)
        return self.get(lo, 0, int(self.sequence_lengths[lo:hi].sum()))


def merge(
    prefixes: list[str], out_prefix: str | os.PathLike, dtype: np.dtype | None = None
) -> IndexedDataset:
    """Concatenate indexed datasets (e.g. shards written in parallel) into one, in order."""
    out_prefix = str(out_prefix)
    Path(out_prefix).parent.mkdir(parents=True, exist_ok=True)
    parts = [IndexedDataset(p) for p in prefixes]
    if dtype is None:
        dtype = parts[0].dtype if parts else np.dtype(np.uint16)
    dtype = np.dtype(dtype)
    for p in parts:
        if p.dtype != dtype:
            raise InputError(
                f"{p.prefix}: dtype {p.dtype}, expected {dtype} to merge into {out_prefix}"
            )
    lengths = [p.sequence_lengths for p in parts]
    doc_index = [np.zeros(1, np.int64)]
    seq_offset = 0
    with open(bin_path(out_prefix), "wb") as out:
        for p in parts:
            with open(bin_path(p.prefix), "rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
            doc_index.append(p.document_indices[1:] + seq_offset)
            seq_offset += len(p)
    write_index(
        idx_path(out_prefix),
        dtype,
        np.concatenate(lengths) if lengths else np.zeros(0, np.int32),
        np.concatenate(doc_index),
    )
    return IndexedDataset(out_prefix)
