"""GPU paths (cuDF MinHash, cuGraph components, dask-cuda cluster); skipped without CUDA."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from tests.curator.prose import mutate_to, prose

pytestmark = pytest.mark.gpu


def test_cudf_minhash_estimates_jaccard():
    pytest.importorskip("cudf")
    from kiln.curator.dedup.gpu import CudfMinHasher

    rng = random.Random(0)
    mh = CudfMinHasher(scheme="permutations")
    errors = []
    for _ in range(10):
        a = prose(rng)
        b, j = mutate_to(rng, a, 0.8, 0.9)
        sa, sb = mh.signatures([a, b])
        errors.append((sa == sb).mean() - j)
    assert abs(np.mean(errors)) < 0.03


def test_cugraph_components_match_scipy():
    pytest.importorskip("cugraph")
    from kiln.curator.dedup.components import duplicates_from_edges

    edges = pd.DataFrame(
        {"a_row": [1, 2, 10], "a_id": ["b", "c", "x"], "b_row": [2, 3, 11], "b_id": ["c", "a", "y"]}
    )
    cpu = duplicates_from_edges(edges)
    gpu = duplicates_from_edges(edges, use_cugraph=True)
    assert cpu[0].tolist() == gpu[0].tolist() and cpu[1] == gpu[1]


def test_cudf_backend_on_local_cuda_cluster(request, tmp_path):
    for module in ("cudf", "dask_cudf", "dask_cuda", "ray"):  # skip, not error, where one lacks
        pytest.importorskip(module)
    request.getfixturevalue("ray_session")  # the curator's Ray Data stream
    from kiln.curator import CurateConfig, curate
    from tests.curator.planted_corpus import make_corpus, write_jsonl

    planted = make_corpus(seed=1, n_clean=20, n_pairs=5)
    write_jsonl(planted, str(tmp_path / "in.jsonl"))
    report = curate(
        CurateConfig(
            input=[str(tmp_path / "in.jsonl")],
            backend="cudf",
            rmm_async=True,
            rmm_release_threshold="1GB",
            read={"max_doc_chars": 20_000},
        ),
        str(tmp_path / "out"),
    )
    assert report["backend"] == "cudf" and report["invariant_holds"]
    assert report["dedup"]["exact_duplicates"] == sum(len(g) - 1 for g in planted.exact_groups)
