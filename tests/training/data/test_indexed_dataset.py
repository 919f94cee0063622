"""Kiln's indexed datasets against the real Megatron-Core reader and builder, both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln.text.indexed_dataset import IndexedDataset, IndexedDatasetWriter, merge
from tests.training.data.megatron_peer import IndexedDataset as MegatronIndexedDataset
from tests.training.data.megatron_peer import IndexedDatasetBuilder


def _documents(n: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_reads_what_kiln_writes(tmp_path, dtype):
    docs = _documents(200, 60000 if dtype == np.uint16 else 100_000)
    with IndexedDatasetWriter(tmp_path / "kiln", dtype) as w:
        for d in docs:
            w.add_document(d)
    ref = MegatronIndexedDataset(str(tmp_path / "kiln"))
    assert len(ref) == len(docs)
    assert ref.document_indices.tolist() == list(range(len(docs) + 1))
    assert ref.sequence_lengths.tolist() == [len(d) for d in docs]
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(ref[i], d)
        assert ref[i].dtype == dtype


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_kiln_writes_the_same_bytes_as_megatron(tmp_path, dtype):
    docs = _documents(100, 1000, seed=1)
    builder = IndexedDatasetBuilder(str(tmp_path / "mega.bin"), dtype=dtype)
    for d in docs:
        builder.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    builder.finalize(str(tmp_path / "mega.idx"))
    with IndexedDatasetWriter(tmp_path / "kiln", dtype) as w:
        for d in docs:
            w.add_document(d)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"kiln.{ext}").read_bytes() == (tmp_path / f"mega.{ext}").read_bytes()


def test_kiln_reads_what_megatron_writes(tmp_path):
    rng = np.random.default_rng(2)
    builder = IndexedDatasetBuilder(str(tmp_path / "mega.bin"), dtype=np.int32)
    docs = []
    for _ in range(50):  # documents of several sequences, as Megatron allows
        lengths = [int(x) for x in rng.integers(1, 20, int(rng.integers(1, 4)))]
        toks = rng.integers(0, 1 << 20, sum(lengths))
        builder.add_document(torch.from_numpy(toks), lengths)
        docs.append((toks, lengths))
    builder.finalize(str(tmp_path / "mega.idx"))
    ref = MegatronIndexedDataset(str(tmp_path / "mega"))
    ours = IndexedDataset(tmp_path / "mega")
    assert ours.dtype == np.int32
    assert ours.num_documents == len(docs)
    np.testing.assert_array_equal(ours.document_indices, ref.document_indices)
    np.testing.assert_array_equal(ours.sequence_lengths, ref.sequence_lengths)
    np.testing.assert_array_equal(ours.sequence_pointers, ref.index.sequence_pointers)
    for i in range(len(ref)):
        np.testing.assert_array_equal(ours[i], ref[i])
    for d, (toks, _) in enumerate(docs):
        np.testing.assert_array_equal(ours.document(d), toks)


def test_merge_of_shards_equals_one_write_and_megatron_reads_it(tmp_path):
    docs = _documents(90, 500, seed=3)
    prefixes = []
    for s in range(3):  # the middle shard is empty, as a batch with no valid documents would be
        part = {0: docs[:45], 1: [], 2: docs[45:]}[s]
        with IndexedDatasetWriter(tmp_path / f"shard{s}", np.uint16) as w:
            for d in part:
                w.add_document(d)
        prefixes.append(str(tmp_path / f"shard{s}"))
    merged = merge(prefixes, tmp_path / "merged")
    assert merged.num_documents == 90
    with IndexedDatasetWriter(tmp_path / "whole", np.uint16) as w:
        for d in docs:
            w.add_document(d)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"merged.{ext}").read_bytes() == (tmp_path / f"whole.{ext}").read_bytes()
    ref = MegatronIndexedDataset(str(tmp_path / "merged"))
    for i, d in enumerate(docs):
        np.testing.assert_array_equal(ref[i], d)
