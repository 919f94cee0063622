"""A GPT dataset over one memory-mapped indexed dataset: documents packed into fixed-length samples.

Three indices, as Megatron-Core's `GPTDataset` builds them (same RandomState calls, same
values — the sample index is checked against Megatron's C++ `build_sample_idx` in the tests):

- document index: the documents of every epoch, shuffled (int32);
- sample index: `[num_samples + 1, 2]` — (position in the document index, offset in that
  document) where each sample starts; sample i spans `seq_len + 1` tokens (inputs + the shifted
  label), so consecutive samples share one token;
- shuffle index: a permutation of the samples.

Megatron builds the sample index with a sequential C++ loop (users report minutes on rank 0 for
large corpora); here it is one `searchsorted` over the cumulative document lengths, so a million
documents index in well under two seconds. The indices are cached on disk under a hash of
everything they depend on, written atomically so concurrent ranks can race safely.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np

from kiln.text.indexed_dataset import IndexedDataset
from kiln.training.data.piece_copy import copy_pieces

ADD_EXTRA_TOKEN = 1  # the label of the last input token


def build_document_index(
    documents: np.ndarray, num_epochs: int, rs: np.random.RandomState, separate_final_epoch: bool
) -> np.ndarray:
    """Megatron's `_build_document_index`: documents repeated per epoch, then shuffled."""
    if not separate_final_epoch or num_epochs == 1:
        index = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
        rs.shuffle(index)
        return index
    first = build_document_index(documents, num_epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return np.concatenate((first, last))


def build_sample_index(
    sizes: np.ndarray,
    document_index: np.ndarray,
    seq_len: int,
    num_epochs: int,
    tokens_per_epoch: int,
) -> np.ndarray:
    """Megatron's `build_sample_idx` (drop the last partial sample), vectorised.

    Sample i starts at token position i * seq_len of the stream of documents in
    document-index order; its row is (the document-index position holding that token,
    the token's offset in the document). Empty documents are skipped as Megatron does:
    `side="right"` picks the last document starting at or before the position.
    """
    num_samples = (num_epochs * tokens_per_epoch - ADD_EXTRA_TOKEN) // seq_len
    lengths = sizes[document_index].astype(np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_len
    doc_pos = np.searchsorted(starts, positions, side="right") - 1
    sample_index = np.empty((num_samples + 1, 2), dtype=np.int64)
    sample_index[:, 0] = doc_pos
    sample_index[:, 1] = positions - starts[doc_pos]
    return sample_index


def build_shuffle_index(num_samples: int, total_size: int, rs: np.random.RandomState) -> np.ndarray:
    """Megatron's `_build_shuffle_index`: [0, num_samples), [num_samples, total) shuffled apart."""
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rs.shuffle(last)
    return np.concatenate((first, last))


def build_indices(
    sizes: np.ndarray, documents: np.ndarray, seq_len: int, seed: int, num_samples: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three indices, as Megatron's `GPTDataset._build_document_sample_shuffle_indices`."""
    tokens_per_epoch = int(sizes[documents].sum(dtype=np.int64))
    if tokens_per_epoch <= seq_len:
        raise ValueError(
            f"{tokens_per_epoch} tokens cannot fill one sample of {seq_len + 1} tokens"
        )
    num_epochs = 1
    if num_samples is not None:
        wanted = num_samples * seq_len + ADD_EXTRA_TOKEN
        num_epochs = max(1, -(-wanted // tokens_per_epoch))
    separate_final_epoch = False
    if num_epochs > 1:
        sans_final = ((num_epochs - 1) * tokens_per_epoch - ADD_EXTRA_TOKEN) // seq_len
        per_epoch = (tokens_per_epoch - ADD_EXTRA_TOKEN) // seq_len
        separate_final_epoch = (num_samples - sans_final) < int(0.80 * per_epoch)
    rs = np.random.RandomState(seed)
    document_index = build_document_index(documents, num_epochs, rs, separate_final_epoch)
    sample_index = build_sample_index(sizes, document_index, seq_len, num_epochs, tokens_per_epoch)
    total = sample_index.shape[0] - 1
    if separate_final_epoch:
        shuffle_index = build_shuffle_index(sans_final, total, rs)
    else:
        shuffle_index = build_shuffle_index(total, total, rs)
    return document_index, sample_index, shuffle_index


def default_cache_dir() -> Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kiln"
    )
    return Path(root) / "gpt_index"


class GPTDataset:
    """Fixed-length samples of `seq_len + 1` tokens packed from one indexed dataset's documents.

    `num_samples=None` means one epoch (as in Megatron). `gather(ids)` and `gather_range(first,
    count)` assemble many samples at once: their document pieces are copied out of the memory
    map and widened to int64 in one compiled call (`piece_copy`).
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        seq_len: int,
        seed: int,
        *,
        num_samples: int | None = None,
        documents: np.ndarray | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.dataset = dataset
        self.seq_len = seq_len
        self.seed = seed
        # Sequences are documents (one sequence per document, as preprocess_data writes them).
        self.sizes = np.asarray(dataset.sequence_lengths)
        self.offsets = dataset.token_offsets
        documents = (
            np.arange(len(dataset), dtype=np.int32) if documents is None else np.asarray(documents)
        )
        key = self._cache_key(documents, num_samples)
        self.cache_path = Path(cache_dir or default_cache_dir()) / key
        loaded = self._load_cache()
        if loaded is None:
            loaded = build_indices(self.sizes, documents, seq_len, seed, num_samples)
            self._save_cache(loaded)
        self.document_index, self.sample_index, self.shuffle_index = loaded

    def __len__(self) -> int:
        return len(self.shuffle_index)

    def _cache_key(self, documents: np.ndarray, num_samples: int | None) -> str:
        idx = Path(self.dataset.prefix + ".idx").resolve()
        stat = idx.stat()
        body = {
            "idx": str(idx),
            "idx_size": stat.st_size,
            "idx_mtime_ns": stat.st_mtime_ns,
            "documents": hashlib.sha256(np.ascontiguousarray(documents).tobytes()).hexdigest(),
            "seq_len": self.seq_len,
            "seed": self.seed,
            "num_samples": num_samples,
            "format": 1,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:20]

    _NAMES = ("document_index", "sample_index", "shuffle_index")

    def _load_cache(self) -> tuple[np.ndarray, ...] | None:
        paths = [self.cache_path / f"{n}.npy" for n in self._NAMES]
        if not all(p.exists() for p in paths):
            return None
        try:
            return tuple(np.load(p, mmap_mode="r") for p in paths)
        except (OSError, ValueError):
            return None  # a torn or foreign file: rebuild

    def _save_cache(self, arrays: tuple[np.ndarray, ...]) -> None:
        try:
            self.cache_path.mkdir(parents=True, exist_ok=True)
            for name, arr in zip(self._NAMES, arrays, strict=False):
                tmp = self.cache_path / f".{name}.{uuid.uuid4().hex}.npy"
                np.save(tmp, arr)
                os.replace(tmp, self.cache_path / f"{name}.npy")
        except OSError:
            pass  # a read-only cache location only costs a rebuild next time

    def __getitem__(self, idx: int) -> np.ndarray:
        return self.gather(np.array([idx]))[0]

    def _pieces(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The document pieces of samples `rows` (sample-index rows): token start in the .bin,
        length, and where each sample's pieces begin (len(rows) + 1 entries)."""
        beg = np.take(self.sample_index, rows, axis=0)
        end = np.take(self.sample_index, rows + 1, axis=0)
        n_pieces = end[:, 0] - beg[:, 0] + 1  # documents each sample touches
        bounds = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(n_pieces, out=bounds[1:])
        first, last = bounds[:-1], bounds[1:] - 1
        doc_pos = np.arange(bounds[-1]) - np.repeat(first - beg[:, 0], n_pieces)
        docs = np.take(self.document_index, doc_pos)
        lo = np.zeros(bounds[-1], dtype=np.int64)
        lo[first] = beg[:, 1]
        hi = np.take(self.sizes, docs).astype(np.int64)
        hi[last] = end[:, 1] + ADD_EXTRA_TOKEN
        return np.take(self.offsets, docs) + lo, hi - lo, bounds

    # Pieces are precomputed for blocks of consecutive (shuffled) samples, so a batch of
    # consecutive sample ids — what the loader asks for — is one slice of a table.
    _BLOCK = 4096

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Block b's pieces: token start in the .bin, length, and where each sample's pieces
        begin (a Python list, so a batch finds its pieces without a numpy call)."""
        cache = self.__dict__.setdefault("_blocks", {})
        if b not in cache:
            rows = np.asarray(
                self.shuffle_index[b * self._BLOCK : (b + 1) * self._BLOCK], dtype=np.int64
            )
            if len(cache) >= 2:
                cache.pop(next(iter(cache)))
            src, lengths, bounds = self._pieces(rows)
            cache[b] = (src, lengths, bounds.tolist())
        return cache[b]

    @functools.cached_property
    def _tokens(self) -> np.ndarray:
        return self.dataset.tokens.view(np.ndarray)  # the memory map, as a plain array

    def gather_range(self, first: int, count: int) -> np.ndarray:
        """Samples `first .. first + count - 1` as an int64 array [count, seq_len + 1]: the
        loader's request, served from the block table with plain Python ints."""
        if first < 0 or first + count > len(self):
            raise IndexError(f"samples [{first}, {first + count}) outside [0, {len(self)})")
        out = np.empty((count, self.seq_len + ADD_EXTRA_TOKEN), dtype=np.int64)
        done = 0
        while done < count:  # one pass per block the range touches (usually one)
            block, k = divmod(first + done, self._BLOCK)
            n = min(count - done, self._BLOCK - k)
            src, lengths, bounds = self._block(block)
            lo, hi = bounds[k], bounds[k + n]
            copy_pieces(self._tokens, src[lo:hi], lengths[lo:hi], out[done : done + n])
            done += n
        return out

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Samples `ids` (any order) as an int64 array [len(ids), seq_len + 1]."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.seq_len + ADD_EXTRA_TOKEN), dtype=np.int64)
        if len(ids) == 0:
            return out
        rows = np.take(self.shuffle_index, ids).astype(np.int64)
        src, lengths, _ = self._pieces(rows)
        copy_pieces(self._tokens, src, lengths, out)
        return out
