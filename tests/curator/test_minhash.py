"""MinHash signatures estimate Jaccard; LSH + connected components keep the smallest id."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from kiln.curator.dedup.components import duplicates_from_edges
from kiln.curator.dedup.minhash import MinHasher
from kiln.curator.dedup.shingles import jaccard, shingle_hashes
from tests.curator.prose import mutate_to, prose
from tests.curator.shingle_sets import shingle_set


def test_shingles_match_a_naive_polynomial_hash():
    texts = ["abcdefgh" * 5, "short", "日本語のテキストです。" * 4]
    h, doc = shingle_hashes(texts, 8)
    assert np.bincount(doc).tolist() == [33, 1, len(texts[2]) - 7]
    naive = {texts[0][i : i + 8] for i in range(33)}
    assert len(np.unique(h[doc == 0])) == len(naive)


@pytest.mark.parametrize("scheme", ["oph", "permutations"])
def test_signature_agreement_estimates_jaccard(scheme):
    rng = random.Random(0)
    mh = MinHasher(scheme=scheme)
    errors = []
    for low, high in [(0.9, 0.97), (0.8, 0.88), (0.5, 0.62)] * 6:
        a = prose(rng)
        b, j = mutate_to(rng, a, low, high)
        sa, sb = mh.signatures([a, b])
        errors.append((sa == sb).mean() - j)
    assert abs(np.mean(errors)) < 0.02 and np.std(errors) < 0.05
    assert (mh.signatures(["same text here"] * 2)[0] == mh.signatures(["same text here"])[0]).all()


def test_banding_collides_similar_documents_only():
    rng = random.Random(1)
    mh = MinHasher()
    a = prose(rng)
    b, _ = mutate_to(rng, a, 0.93, 0.97)
    c = prose(rng)
    bands = mh.band_hashes(mh.signatures([a, b, c]))
    assert (bands[0] == bands[1]).any() and not (bands[0] == bands[2]).any()
    assert jaccard(shingle_set(a, 24), shingle_set(c, 24)) < 0.05


def test_components_keep_the_smallest_id():
    edges = pd.DataFrame(
        {"a_row": [1, 2, 10], "a_id": ["b", "c", "x"], "b_row": [2, 3, 11], "b_id": ["c", "a", "y"]}
    )
    removed, clusters = duplicates_from_edges(edges)
    assert clusters == 2
    assert removed.tolist() == [1, 2, 11]  # keeps row 3 ("a") and row 10 ("x")


def test_pair_jaccard_in_chunks_equals_each_pairs_own_jaccard(monkeypatch):
    from kiln.curator.dedup import verify

    rng = random.Random(2)
    texts = [prose(rng) for _ in range(12)]
    texts += [mutate_to(rng, texts[i], 0.7, 0.95)[0] for i in range(12)]
    series = pd.Series(texts, index=np.arange(100, 100 + len(texts)))
    pairs = pd.DataFrame(
        [(100 + i, 100 + j) for i in range(len(texts)) for j in range(len(texts)) if i < j],
        columns=["a_row", "b_row"],
    ).sample(frac=1.0, random_state=0)  # shuffled: scores must come back in the pairs' order
    expected = [
        jaccard(shingle_set(series[a], 24), shingle_set(series[b], 24))
        for a, b in zip(pairs["a_row"], pairs["b_row"], strict=True)
    ]
    monkeypatch.setattr(verify, "PAIRS_PER_CHUNK", 7)  # 276 pairs in 40 chunks
    np.testing.assert_allclose(verify.pair_jaccard(pairs, series, 24), expected)
    assert max(expected) > 0.7  # the mutated copies are among the pairs


def test_local_dedup_shuffles_spill_into_the_given_dir(tmp_path, monkeypatch):
    import tempfile

    import dask.dataframe as dd
    import dask.dataframe.shuffle

    from kiln.curator.dedup.engine import dask_session

    made = []
    real = tempfile.mkdtemp
    monkeypatch.setattr(
        dask.dataframe.shuffle.tempfile,
        "mkdtemp",
        lambda *a, **k: made.append(k.get("dir")) or real(*a, **k),
    )
    frame = pd.DataFrame({"k": np.arange(5000) % 97, "v": np.arange(5000)})
    with dask_session("pandas", "local", spill_dir=str(tmp_path / "dask")):
        parts = dd.from_pandas(frame, npartitions=4).shuffle(on="k").map_partitions(len)
        assert int(parts.compute().sum()) == len(frame)
    assert made == [str(tmp_path / "dask")]


def test_dedup_on_ray_shuffles_as_tasks():
    import dask

    from kiln.curator.dedup.engine import dask_session

    with dask_session("pandas", "ray", spill_dir="/unused"):
        assert dask.config.get("dataframe.shuffle.method") == "tasks"
        assert dask.config.get("temporary_directory", None) is None
