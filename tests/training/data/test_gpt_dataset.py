"""Document/sample/shuffle indices as Megatron builds them; packing; blending; the disk cache."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.text.indexed_dataset import IndexedDataset
from kiln.training.data.blended_dataset import BlendedDataset, build_blending_indices
from kiln.training.data.gpt_dataset import GPTDataset, build_indices
from tests.training.data.helpers import write_unique_dataset
from tests.training.data.megatron_peer import (
    _build_document_index,
    _build_shuffle_index,
    helpers_cpp,
)


@pytest.mark.parametrize(
    "num_samples", [None, 700, 1200]
)  # one epoch; 3 epochs with/without a separate last one
def test_indices_equal_megatrons(tmp_path, num_samples):
    write_unique_dataset(tmp_path / "d", 300, 50)
    ds = IndexedDataset(tmp_path / "d")
    seq_len, seed = 32, 7
    documents = np.arange(len(ds), dtype=np.int32)
    doc_index, sample_index, shuffle_index = build_indices(
        ds.sequence_lengths, documents, seq_len, seed, num_samples
    )

    # Megatron's own functions, driven the way GPTDataset drives them
    tokens_per_epoch = ds.num_tokens
    num_epochs = 1 if num_samples is None else -(-(num_samples * seq_len + 1) // tokens_per_epoch)
    separate = False
    if num_epochs > 1:
        sans_final = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_len
        separate = num_samples - sans_final < int(0.8 * ((tokens_per_epoch - 1) // seq_len))
    rs = np.random.RandomState(seed)
    ref_doc = _build_document_index(documents, num_epochs, rs, separate)
    ref_sample = helpers_cpp.build_sample_idx_int64(
        np.array(ds.sequence_lengths), ref_doc, seq_len, num_epochs, tokens_per_epoch, True, 1
    )
    total = ref_sample.shape[0] - 1
    ref_shuffle = _build_shuffle_index(sans_final if separate else total, total, rs)
    np.testing.assert_array_equal(doc_index, ref_doc)
    np.testing.assert_array_equal(sample_index, ref_sample)
    np.testing.assert_array_equal(shuffle_index, ref_shuffle)
    if num_samples is not None:
        assert len(shuffle_index) >= num_samples


def test_one_epoch_packs_every_token_once(tmp_path):
    write_unique_dataset(tmp_path / "d", 400, 60, seed=1)
    ds = IndexedDataset(tmp_path / "d")
    gpt = GPTDataset(ds, seq_len=16, seed=3, cache_dir=tmp_path / "cache")
    samples = gpt.gather(np.arange(len(gpt)))
    assert samples.shape == (len(gpt), 17)
    # The stream of tokens in (shuffled) document order; sample i is stream[16 i : 16 i + 17].
    stream = np.concatenate([ds.document(int(d)) for d in gpt.document_index])
    order = np.argsort(gpt.shuffle_index)
    for i in (0, 1, len(gpt) // 2, len(gpt) - 1):
        np.testing.assert_array_equal(samples[order[i]], stream[16 * i : 16 * i + 17])
    inputs = samples[:, :-1].ravel()
    assert len(np.unique(inputs)) == len(inputs) == 16 * len(gpt)  # no token twice as an input
    missing = np.setdiff1d(np.arange(ds.num_tokens), inputs)
    np.testing.assert_array_equal(
        np.sort(missing), np.sort(stream[16 * len(gpt) :])
    )  # only the short tail
    assert len(missing) <= 16


def test_same_seed_same_samples_other_seed_other_order(tmp_path):
    write_unique_dataset(tmp_path / "d", 200, 40)
    ds = IndexedDataset(tmp_path / "d")
    a = GPTDataset(ds, 16, 1, cache_dir=tmp_path / "c1").gather(np.arange(50))
    b = GPTDataset(ds, 16, 1, cache_dir=tmp_path / "c2").gather(np.arange(50))
    c = GPTDataset(ds, 16, 2, cache_dir=tmp_path / "c1").gather(np.arange(50))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_index_is_cached_on_disk_under_a_hash_of_its_inputs(tmp_path):
    write_unique_dataset(tmp_path / "d", 200, 40)
    ds = IndexedDataset(tmp_path / "d")
    first = GPTDataset(ds, 16, 1, cache_dir=tmp_path / "cache")
    assert sorted(p.name for p in first.cache_path.iterdir()) == [
        "document_index.npy",
        "sample_index.npy",
        "shuffle_index.npy",
    ]
    again = GPTDataset(ds, 16, 1, cache_dir=tmp_path / "cache")
    assert again.cache_path == first.cache_path
    assert isinstance(again.shuffle_index, np.memmap)  # loaded, not rebuilt
    np.testing.assert_array_equal(again.sample_index, first.sample_index)
    assert GPTDataset(ds, 32, 1, cache_dir=tmp_path / "cache").cache_path != first.cache_path
    assert GPTDataset(ds, 16, 2, cache_dir=tmp_path / "cache").cache_path != first.cache_path


def test_blend_follows_the_weights_in_every_prefix(tmp_path):
    write_unique_dataset(tmp_path / "a", 300, 40, seed=1)
    write_unique_dataset(tmp_path / "b", 300, 40, seed=2, base=1 << 24)
    parts = [
        GPTDataset(IndexedDataset(tmp_path / n), 16, 5, cache_dir=tmp_path / "c") for n in "ab"
    ]
    blend = BlendedDataset(parts, [3.0, 1.0])
    assert blend.size <= len(parts[1]) * 4 and blend.size <= len(parts[0]) * 4 / 3
    which = blend.dataset_index
    for n in (1, 10, 57, blend.size):
        assert abs((which[:n] == 0).sum() - 0.75 * n) <= 1
    samples = blend.gather(np.arange(blend.size))
    np.testing.assert_array_equal(
        samples[:, 0] >= (1 << 24), which == 1
    )  # rows really come from that dataset
    # within each dataset, samples are taken in order without repeats
    for d in (0, 1):
        local = blend.dataset_sample_index[which == d]
        np.testing.assert_array_equal(local, np.arange(len(local)))


def test_blending_indices_three_way():
    which, _ = build_blending_indices(np.array([0.5, 0.3, 0.2]), 1000, [10_000] * 3)
    counts = np.bincount(which, minlength=3)
    np.testing.assert_allclose(counts, [500, 300, 200], atol=1)


def test_block_path_and_general_path_agree(tmp_path):
    write_unique_dataset(tmp_path / "d", 300, 60, seed=6)
    gpt = GPTDataset(IndexedDataset(tmp_path / "d"), 16, 0, cache_dir=tmp_path / "c")
    gpt._BLOCK = 7  # ranges cross many small blocks
    ids = np.arange(len(gpt))
    every = gpt.gather(ids)
    for first, count in [(0, 1), (0, 7), (3, 9), (5, 20), (len(gpt) - 4, 4), (0, len(gpt))]:
        np.testing.assert_array_equal(gpt.gather_range(first, count), every[first : first + count])
    shuffled = np.random.default_rng(0).permutation(ids)
    np.testing.assert_array_equal(gpt.gather(shuffled), every[shuffled])
    np.testing.assert_array_equal(np.stack([gpt[int(i)] for i in ids[:20]]), every[:20])
    with pytest.raises(IndexError, match="outside"):
        gpt.gather_range(len(gpt) - 2, 3)
