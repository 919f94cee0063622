"""Perplexity filter with a Kiln model (CCNet style): a tiny model trained here on reference text
ranks fresh reference text below generated junk for >= 90% of pairs (English and Japanese), and
the classify stage buckets the corpus into head/middle/tail with counts conserved."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from kiln.curator.classify import ClassifyConfig, classify
from kiln.curator.classify.perplexity import PerplexityScorer
from tests.curator.quality_docs import high_quality, low_quality


def _reference(rng: random.Random, n: int) -> list[str]:
    return [high_quality(rng, lang) for lang in ("en", "ja") for _ in range(n)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """(checkpoint step folder, tokenizer.json) of a 2-layer model trained on reference text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from kiln.model.config import ModelConfig
    from kiln.model.formats.checkpoint import write_checkpoint
    from kiln.model.transformer import Transformer

    root = tmp_path_factory.mktemp("ppl-model")
    texts = _reference(random.Random(0), 150)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(root / "tokenizer.json"))
    stream = torch.tensor([i for e in tok.encode_batch(texts) for i in e.ids])
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend on a busy machine
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), dim=64, n_layers=2, n_heads=4,
                      ffn_hidden_dim=128, max_seq_len=128)  # fmt: skip
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(100):
        starts = torch.randint(0, len(stream) - 65, (8,))
        batch = torch.stack([stream[s : s + 65] for s in starts])
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    return write_checkpoint(str(root / "ckpt"), model.eval()), str(root / "tokenizer.json")


def test_reference_text_has_lower_perplexity_than_junk(lm):
    scorer = PerplexityScorer(*lm, max_tokens=128)
    rng = random.Random(1)
    for lang in ("en", "ja"):
        good = scorer.perplexity([high_quality(rng, lang) for _ in range(20)])
        junk = scorer.perplexity([low_quality(rng, lang) for _ in range(20)])
        assert np.mean(good[:, None] < junk[None, :]) >= 0.9, lang
    # Scoring in a driver must not switch autograd off for whatever trains next in the process.
    assert torch.is_grad_enabled()


def test_classify_buckets_by_perplexity(lm, tmp_path):
    rng = random.Random(2)
    docs = [{"id": f"g{i}", "text": t} for i, t in enumerate(_reference(rng, 10))]
    docs += [{"id": f"j{i}", "text": low_quality(rng, ("en", "ja")[i % 2])} for i in range(20)]
    with open(tmp_path / "in.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    model, tokenizer = lm
    cfg = ClassifyConfig(
        input=[str(tmp_path / "in.jsonl")],
        kind="perplexity",
        perplexity={"model": model, "tokenizer": tokenizer, "max_tokens": 128,
                    "head_percent": 40, "tail_percent": 40, "keep_buckets": ["head"]},
    )  # fmt: skip
    report = classify(cfg, str(tmp_path / "out"))
    assert (
        report["documents_in"] == 40 == report["kept"] + report["removed_by_reason"]["perplexity"]
    )
    assert report["kept"] == 16  # the 40% lowest perplexities
    import pyarrow.parquet as pq

    kept = pq.read_table(tmp_path / "out" / "shard-00000.parquet").to_pylist()
    assert {r["perplexity_bucket"] for r in kept} == {"head"}
    assert sum(r["id"].startswith("g") for r in kept) >= 14  # the head is reference text
