"""Tokenise a Parquet corpus in parallel with Ray Data and write Megatron indexed datasets.

Actors (fractional CPUs, so a small machine never starves the read tasks) each hold the
tokenizer, encode a batch of documents, append the end-of-document token, assign each document to
train/valid/test by a seeded hash of its id (so the split never depends on batching or order)
and write one indexed-dataset shard per split. The driver then merges the shards of each split,
in the order Ray Data produced them (`preserve_order`), into `<out>/<split>.bin/.idx`.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

import numpy as np

from kiln.platform.console import Progress
from kiln.platform.errors import InputError
from kiln.text import indexed_dataset

SPLITS = ("train", "valid", "test")


def corpus_files(corpus_dir: str) -> list[str]:
    """The Parquet shards of a Corpus (not its `rejected/` documents)."""
    root = Path(corpus_dir)
    files = sorted(root.glob("*.parquet")) or sorted(
        p for p in root.rglob("*.parquet") if "rejected" not in p.relative_to(root).parts
    )
    if not files:
        raise InputError(
            f"{corpus_dir}: no Parquet shards found (a Corpus holds *.parquet with id, text)"
        )
    return [str(f) for f in files]


def corpus_documents(files: list[str]) -> int:
    """Documents in the shards, from their Parquet footers (nothing read): progress's total."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


class TokenizeProgress(Progress):
    """Documents tokenised (the bar, its ETA) and tokens written so far (its postfix)."""

    def __init__(self, files: list[str]) -> None:
        super().__init__(corpus_documents(files), "tokenize", unit="documents")
        self.tokens = 0

    def shard(self, documents: int, tokens: int) -> None:
        self.tokens += int(tokens)
        self.advance(int(documents), f"{self.tokens:,} tokens")


def split_of(doc_id: str, seed: int, valid_fraction: float, test_fraction: float) -> str:
    """train/valid/test for one document, from a seeded hash of its id."""
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    u = int.from_bytes(h, "little") / 2.0**64
    if u < valid_fraction:
        return "valid"
    if u < valid_fraction + test_fraction:
        return "test"
    return "train"


class ShardTokenizer:
    """A Ray Data actor: one batch of documents in, one indexed-dataset shard per split out."""

    def __init__(
        self,
        tokenizer_json: str,
        eod_id: int,
        dtype: str,
        shard_dir: str,
        seed: int,
        valid_fraction: float,
        test_fraction: float,
    ) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(tokenizer_json)
        self.eod_id = eod_id
        self.dtype = np.dtype(dtype)
        self.shard_dir = Path(shard_dir)
        self.seed, self.valid_fraction, self.test_fraction = seed, valid_fraction, test_fraction

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        ids = [str(i) for i in batch["id"]]
        texts = [t if isinstance(t, str) else "" for t in batch["text"]]
        encodings = self.tok.encode_batch(texts, add_special_tokens=False)
        name = uuid.uuid4().hex
        writers: dict[str, indexed_dataset.IndexedDatasetWriter] = {}
        for doc_id, enc in zip(ids, encodings, strict=False):
            split = split_of(doc_id, self.seed, self.valid_fraction, self.test_fraction)
            if split not in writers:
                writers[split] = indexed_dataset.IndexedDatasetWriter(
                    self.shard_dir / split / name, self.dtype
                )
            tokens = np.empty(len(enc.ids) + 1, dtype=self.dtype)
            tokens[:-1] = enc.ids
            tokens[-1] = self.eod_id
            writers[split].add_document(tokens)
        out: dict[str, list] = {"split": [], "prefix": [], "documents": [], "tokens": []}
        for split, w in writers.items():
            w.finalize()
            out["split"].append(split)
            out["prefix"].append(w.prefix)
            out["documents"].append(w.num_documents)
            out["tokens"].append(w.num_tokens)
        return out


def tokenize_corpus(
    corpus_dir: str,
    out_dir: str,
    tokenizer_json: str,
    *,
    eod_id: int,
    vocab_size: int,
    seed: int,
    valid_fraction: float,
    test_fraction: float,
    batch_size: int,
    num_actors: int,
    cpus_per_actor: float,
) -> dict[str, dict[str, int]]:
    """Tokenise every document into `<out_dir>/{train,valid,test}.bin/.idx`; counts per split."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = (
        True  # shards merge in corpus order: deterministic output
    )
    dtype = indexed_dataset.token_dtype(vocab_size)
    shard_dir = Path(out_dir) / "_shards"
    files = corpus_files(corpus_dir)
    # At least one block per actor, or a small corpus arrives as one block and one actor idles.
    ds = ray.data.read_parquet(
        files, override_num_blocks=max(len(files), num_actors)
    ).select_columns(["id", "text"])
    shards = ds.map_batches(
        ShardTokenizer,
        fn_constructor_kwargs={
            "tokenizer_json": tokenizer_json,
            "eod_id": eod_id,
            "dtype": dtype.name,
            "shard_dir": str(shard_dir),
            "seed": seed,
            "valid_fraction": valid_fraction,
            "test_fraction": test_fraction,
        },
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_cpus=cpus_per_actor,
    )
    rows = []
    with TokenizeProgress(files) as progress:
        for row in shards.iter_rows():  # as batches finish (in corpus order), not all at the end
            progress.shard(row["documents"], row["tokens"])
            rows.append(row)
    counts = {}
    for split in SPLITS:
        merged = indexed_dataset.merge(
            [r["prefix"] for r in rows if r["split"] == split], Path(out_dir) / split, dtype=dtype
        )
        counts[split] = {"documents": merged.num_documents, "tokens": merged.num_tokens}
    shutil.rmtree(shard_dir, ignore_errors=True)
    return counts
