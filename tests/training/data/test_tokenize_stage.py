"""The tokenize stage end to end: a Parquet corpus -> tokenizer + Megatron datasets per split ->
batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kiln.platform.artifact import Artifact
from kiln.platform.errors import ConfigError
from kiln.platform.pipeline import Pipeline
from kiln.platform.runtime import Runtime
from kiln.text.tokenizer import load_tokenizer
from kiln.training.data import DataConfig, build_dataloader
from kiln.training.data.parallel_tokenize import corpus_files, split_of
from kiln.training.data.stages import TokenizeConfig, TokenizeStage, obtain_tokenizer
from tests.training.data.corpus import documents, write_corpus
from tests.training.data.megatron_peer import IndexedDataset as MegatronIndexedDataset

N_DOCS = 400
pytestmark = pytest.mark.slow  # the stage end to end on Ray Data actors


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    corpus = write_corpus(root / "corpus", N_DOCS)
    stage = TokenizeStage(
        vocab_size=500,
        valid_fraction=0.1,
        test_fraction=0.1,
        seed=5,
        batch_size=64,
        num_actors=2,
        inputs={"corpus": str(corpus)},
    )
    result = Pipeline("tok", [stage], runs_dir=root / "runs").run(runtime=Runtime(), shutdown=False)
    return root, result


def test_outputs_are_committed_artifacts(run):
    _, result = run
    tokens = Artifact.load(result.artifact("tokenize.tokens").uri)
    tokenizer = Artifact.load(result.artifact("tokenize.tokenizer").uri)
    assert tokens.kind == "TokenDataset" and tokenizer.kind == "Tokenizer"
    assert tokens.counts["documents"] == N_DOCS  # rejected/ is not part of the corpus
    assert (
        tokens.counts["train_documents"]
        + tokens.counts["valid_documents"]
        + tokens.counts["test_documents"]
        == N_DOCS
    )
    files = sorted(p.name for p in Path(tokens.uri).iterdir())
    for name in (
        "train.bin",
        "train.idx",
        "valid.bin",
        "valid.idx",
        "test.bin",
        "test.idx",
        "tokenizer.json",
        "tokens.json",
        "document_lengths.png",
    ):
        assert name in files
    assert not any(name.startswith("_shards") for name in files)


def test_megatron_reads_every_document_back_to_the_original_text(run):
    _, result = run
    out = Path(result.artifact("tokenize.tokens").uri)
    meta = json.loads((out / "tokens.json").read_text())
    tok = load_tokenizer(out)
    eod = meta["eod_id"]
    texts = documents(N_DOCS)
    ids = [f"doc-{i}" for i in range(N_DOCS)]  # write_corpus numbers documents in order
    for split in ("train", "valid", "test"):
        pairs = zip(ids, texts, strict=False)
        expected = [t for i, t in pairs if split_of(i, 5, 0.1, 0.1) == split]
        ds = MegatronIndexedDataset(str(out / split))
        assert len(ds) == len(expected) == meta["splits"][split]["documents"]
        assert ds[0].dtype == np.uint16  # vocab 500 -> Megatron's optimal dtype
        for i, text in enumerate(expected):
            doc = ds[i]
            assert doc[-1] == eod
            assert tok.decode(doc[:-1].tolist(), skip_special_tokens=False) == text


def test_output_feeds_the_loader_and_a_rerun_is_cached(run):
    root, result = run
    out = result.artifact("tokenize.tokens").uri
    cfg = DataConfig(paths=[out], split="valid", index_cache_dir=str(root / "idx"))
    tokens, _ = next(
        build_dataloader(
            cfg, seq_len=32, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0, vocab_size=500
        )
    )
    assert tokens.shape == (2, 32) and int(tokens.max()) < 500
    with pytest.raises(ConfigError, match="vocab"):  # a model too small for the tokenizer
        build_dataloader(
            cfg, seq_len=32, micro_batch_size=2, dp_rank=0, dp_size=1, seed=0, vocab_size=100
        )
    again = Pipeline(
        "tok",
        [
            TokenizeStage(
                vocab_size=500,
                valid_fraction=0.1,
                test_fraction=0.1,
                seed=5,
                batch_size=64,
                num_actors=2,
                inputs={"corpus": str(root / "corpus")},
            )
        ],
        runs_dir=root / "runs",
    ).run(runtime=Runtime(), shutdown=False)
    assert again.stage_status("tokenize") == "cached"


def test_existing_tokenizer_is_loaded_not_trained(run):
    root, result = run
    tk = result.artifact("tokenize.tokenizer").uri
    cfg = TokenizeConfig(tokenizer=tk, vocab_size=300)
    tok = obtain_tokenizer(cfg, corpus_files(str(root / "corpus")))
    trained = load_tokenizer(tk)
    assert tok.to_str() == trained.to_str()  # vocab_size is ignored: nothing was trained
    assert (
        TokenizeStage(cfg).extra_fingerprint() != ""
    )  # the file's content is part of the cache key
