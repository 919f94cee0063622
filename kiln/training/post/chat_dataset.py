"""Chat data on disk: a Megatron indexed dataset of tokens plus a parallel loss-mask dataset.

`<prefix>.bin/.idx` hold the token ids, one sequence per conversation; a Megatron *document*
groups the sequences of one training row: a packed row for SFT, or the (chosen, rejected) pair
for preference data. `<prefix>.loss_mask.bin/.idx` holds one uint8 per token (1: trained on),
with the same sequence lengths. `<prefix>.chat.json` records the kind, `seq_len` and the report.

A row becomes fixed-size arrays of `seq_len` positions: `tokens`, `labels` (the next token where
it is trained on, else -100), `positions` (restarting at 0 in each conversation) and
`document_ids` (which conversation of the row; -1 on padding).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import numpy as np

from kiln.platform.errors import InputError
from kiln.text.indexed_dataset import IndexedDataset, IndexedDatasetWriter, exists

IGNORE_INDEX = -100
Kind = Literal["sft", "preference"]


def mask_prefix(prefix: str | os.PathLike) -> str:
    return f"{prefix}.loss_mask"


def meta_path(prefix: str | os.PathLike) -> str:
    return f"{prefix}.chat.json"


def is_chat_dataset(prefix: str | os.PathLike) -> bool:
    return os.path.isfile(meta_path(prefix)) and exists(mask_prefix(prefix))


class ChatDatasetWriter:
    """Writes rows of (token ids, loss mask) sequences as tokens + loss-mask indexed datasets."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type) -> None:
        self.prefix = str(prefix)
        self.tokens = IndexedDatasetWriter(self.prefix, dtype)
        self.masks = IndexedDatasetWriter(mask_prefix(self.prefix), np.uint8)

    def add_row(self, sequences: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for ids, mask in sequences:
            if len(ids) != len(mask):
                raise ValueError(f"{len(ids)} tokens but {len(mask)} mask entries")
            self.tokens.add_sequence(ids)
            self.masks.add_sequence(mask)
        self.tokens.end_document()
        self.masks.end_document()

    def finalize(self, meta: dict) -> None:
        self.tokens.finalize()
        self.masks.finalize()
        Path(meta_path(self.prefix)).write_text(json.dumps(meta, indent=2, ensure_ascii=False))


def row_arrays(
    sequences: list[tuple[np.ndarray, np.ndarray]], seq_len: int, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One row of `seq_len` positions: (tokens, labels, positions, document_ids), int64 each."""
    tokens = np.full(seq_len, pad_id, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros(seq_len, dtype=np.int64)
    document_ids = np.full(seq_len, -1, dtype=np.int64)
    at = 0
    for doc, (ids, mask) in enumerate(sequences):
        n = min(len(ids) - 1, seq_len - at)
        if n <= 0:
            continue
        tokens[at : at + n] = ids[:n]
        labels[at : at + n] = np.where(mask[1 : n + 1] > 0, ids[1 : n + 1], IGNORE_INDEX)
        positions[at : at + n] = np.arange(n)
        document_ids[at : at + n] = doc
        at += n
    return tokens, labels, positions, document_ids


class ChatDataset:
    """Read side: rows of a chat dataset as fixed-size arrays."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        if not is_chat_dataset(self.prefix):
            raise InputError(
                f"{self.prefix}: not a chat dataset (expected .bin/.idx, .loss_mask.bin/.idx "
                "and .chat.json from prepare-chat or prepare-preference)"
            )
        self.meta = json.loads(Path(meta_path(self.prefix)).read_text())
        self.kind: Kind = self.meta["kind"]
        self.seq_len: int = int(self.meta["seq_len"])
        self.pad_id: int = int(self.meta.get("pad_id", 0))
        self.tokens = IndexedDataset(self.prefix)
        self.masks = IndexedDataset(mask_prefix(self.prefix))
        if not np.array_equal(self.tokens.sequence_lengths, self.masks.sequence_lengths):
            raise InputError(f"{self.prefix}: loss mask lengths differ from the token lengths")

    def __len__(self) -> int:
        """Rows: packed SFT rows, or preference pairs."""
        return self.tokens.num_documents

    def sequences(self, row: int) -> list[tuple[np.ndarray, np.ndarray]]:
        lo, hi = (int(x) for x in self.tokens.document_indices[row : row + 2])
        return [(self.tokens[i], self.masks[i]) for i in range(lo, hi)]

    def gather_rows(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """(tokens, labels, positions, document_ids), each [B, seq_len] for SFT rows, or
        [2B, seq_len] for preference pairs: the B chosen rows first, then the B rejected."""
        if self.kind == "sft":
            built = [row_arrays(self.sequences(int(r)), self.seq_len, self.pad_id) for r in rows]
        else:
            pairs = [self.sequences(int(r)) for r in rows]
            built = [row_arrays([p[0]], self.seq_len, self.pad_id) for p in pairs]
            built += [row_arrays([p[1]], self.seq_len, self.pad_id) for p in pairs]
        return tuple(np.stack(parts) for parts in zip(*built, strict=True))


class ChatSource:
    """The loader's sample source over a chat dataset: sample j is row `perm_p[j % N]` of pass
    p = j // N, each pass a fresh permutation seeded `seed + p`, so sample j is a pure function of
    (data, seed, j) and the loader's resume and data-parallel split carry over unchanged."""

    def __init__(self, prefix: str | os.PathLike, seed: int, shuffle: bool = True) -> None:
        self.dataset = ChatDataset(prefix)
        self.seed, self.shuffle = seed, shuffle
        self.seq_len = self.dataset.seq_len
        self.pass_length = len(self.dataset)
        if self.pass_length == 0:
            raise InputError(f"{prefix}: the chat dataset has no rows")
        self._perms: dict[int, np.ndarray] = {}

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        passes, local = np.divmod(ids, self.pass_length)
        if not self.shuffle:
            return local
        out = np.empty_like(local)
        for p in np.unique(passes).tolist():
            if p not in self._perms:
                self._perms = {k: v for k, v in self._perms.items() if k >= p - 1}
                self._perms[p] = np.random.RandomState(self.seed + p).permutation(self.pass_length)
            sel = passes == p
            out[sel] = self._perms[p][local[sel]]
        return out

    def gather_batch(self, first: int, count: int) -> tuple[np.ndarray, ...]:
        """(tokens, labels, positions, document_ids), plus the pair numbers for preference data
        (where precomputed reference log-probs are looked up)."""
        rows = self._rows(np.arange(first, first + count))
        arrays = self.dataset.gather_rows(rows)
        return arrays + (rows.astype(np.int64),) if self.dataset.kind == "preference" else arrays
