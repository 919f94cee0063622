"""The learned classifier's BERT encoder (`classify/bert_encoder.py`) on a tiny BERT built here:
the head of a document gives the tokens of the whole document, float32 vectors equal semantic
dedup's `Embedder` (the reference forward, itself tested against transformers), length-sorted
batches give every document the vector it has alone and in input order, and bf16 on the CPU's
matrix units stays within 1e-2 of float32."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenizers.implementations import BertWordPieceTokenizer

from kiln.curator.classify.bert_encoder import CHARS_PER_TOKEN, BertSentenceEncoder
from kiln.curator.dedup.semantic import Embedder
from kiln.model.cpu_linear import cpu_has_bf16_matmul
from tests.curator.prose import japanese, prose

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 64, 128


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """English and Japanese documents from a few words to several times the window."""
    rng = random.Random(0)
    docs = [prose(rng)[: rng.randint(20, 3000)] for _ in range(14)]
    docs += [japanese(rng)[: rng.randint(10, 1500)] for _ in range(8)]
    docs += ["short", "x" * 2000, "tail " * 30 + "y" * 900]  # one long word; a long last word
    return docs


@pytest.fixture(scope="module")
def bert(tmp_path_factory, texts) -> str:
    """A random 2-layer BERT folder (config.json, model.safetensors, tokenizer.json)."""
    folder = tmp_path_factory.mktemp("tiny-bert")
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts, vocab_size=400, min_frequency=1)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    cfg = {"model_type": "bert", "hidden_act": "gelu", "hidden_size": HIDDEN,
           "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": FFN,
           "max_position_embeddings": POSITIONS, "vocab_size": vocab}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    w = {
        "embeddings.word_embeddings.weight": rand(vocab, HIDDEN),
        "embeddings.position_embeddings.weight": rand(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
    }
    norms = ["embeddings.LayerNorm"]
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        dense = {f"{p}.attention.self.{n}": (HIDDEN, HIDDEN) for n in ("query", "key", "value")}
        dense |= {f"{p}.attention.output.dense": (HIDDEN, HIDDEN)}
        dense |= {f"{p}.intermediate.dense": (FFN, HIDDEN), f"{p}.output.dense": (HIDDEN, FFN)}
        for name, shape in dense.items():
            w[f"{name}.weight"], w[f"{name}.bias"] = rand(*shape), rand(shape[0])
        norms += [f"{p}.attention.output.LayerNorm", f"{p}.output.LayerNorm"]
    for name in norms:
        w[f"{name}.weight"], w[f"{name}.bias"] = 1 + rand(HIDDEN), rand(HIDDEN)
    save_file(w, str(folder / "model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("max_tokens", [8, 40, 128])
def test_a_documents_head_gives_its_tokens(bert, texts, max_tokens):
    enc = BertSentenceEncoder(bert, max_tokens, batch_size=4, precision="fp32")
    whole = [e.ids for e in enc.tok.encode_batch(texts)]  # truncated to max_tokens
    assert enc.ids(texts) == whole
    cut = max_tokens * CHARS_PER_TOKEN
    assert any(len(t) > cut for t in texts)  # some documents were cut before tokenising
    assert max(len(x) for x in whole) == max_tokens


def test_float32_equals_semantic_dedups_embedder(bert, texts):
    ours = BertSentenceEncoder(bert, 64, batch_size=5, precision="fp32")(texts)
    reference = Embedder(bert, 64, batch_size=5)(texts)
    assert ours.shape == (len(texts), HIDDEN)
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_length_sorted_batches_keep_input_order_and_each_vector(bert, texts):
    enc = BertSentenceEncoder(bert, 64, batch_size=4, precision="fp32")
    batched = enc(texts)
    alone = np.concatenate([enc([t]) for t in texts])
    np.testing.assert_allclose(batched, alone, atol=1e-5)
    order = np.random.default_rng(1).permutation(len(texts))
    shuffled = enc([texts[i] for i in order])
    np.testing.assert_allclose(shuffled, batched[order], atol=1e-5)
    assert np.array_equal(enc(texts), batched)  # the same texts: the same bits


@pytest.mark.skipif(not cpu_has_bf16_matmul(), reason="no AMX / AVX-512-BF16 on this CPU")
def test_bf16_on_matrix_units_stays_close_to_float32(bert, texts):
    auto = BertSentenceEncoder(bert, 64, batch_size=4)  # precision auto: bf16 here
    assert auto.bf16
    fp32 = BertSentenceEncoder(bert, 64, batch_size=4, precision="fp32")(texts)
    ours = auto(texts)
    cosine = (ours * fp32).sum(axis=1)
    assert cosine.min() > 0.99, cosine.min()
    assert np.array_equal(auto(texts), ours)  # deterministic run to run
