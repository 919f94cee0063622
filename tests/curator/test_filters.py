"""Filters: each planted junk document is removed by its own rule; Japanese prose passes; the
batch language identifier equals langid.classify; user filters plug in."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kiln.curator.config import CurateConfig, FilterConfig
from kiln.curator.filters import DocBatch, DocumentFilter, build_filters
from kiln.curator.filters.langid_batch import batch_langid
from kiln.curator.process import ChunkProcessor
from tests.curator.corpus import DE_SENTENCES, japanese, junk_docs, prose


def _reasons(proc: ChunkProcessor, texts: dict[str, str]) -> dict[str, str | None]:
    recs = [{"id": k, "text": t, "source": "t", "reason": None} for k, t in texts.items()]
    _, rejected, _ = proc.process(recs, np.arange(len(recs), dtype=np.int64))
    got = dict(
        zip(rejected.column("id").to_pylist(), rejected.column("reason").to_pylist(), strict=True)
    )
    return {k: got.get(k) for k in texts}


@pytest.fixture(scope="module")
def proc() -> ChunkProcessor:
    return ChunkProcessor(CurateConfig())


@pytest.mark.parametrize("seed", [0, 1])
def test_each_junk_document_is_removed_by_its_own_filter(proc, seed):
    junk = junk_docs(random.Random(seed))
    got = _reasons(proc, {id_: text for id_, text in junk.values()})
    assert got == {id_: reason for reason, (id_, _) in junk.items()}
    names = {f.name for f in proc.filters}
    assert set(junk) <= names  # every built-in filter has its junk


def test_clean_english_and_japanese_prose_is_kept(proc):
    rng = random.Random(3)
    texts = {f"en{i}": prose(rng) for i in range(20)} | {f"ja{i}": japanese(rng) for i in range(10)}
    assert set(_reasons(proc, texts).values()) == {None}


def test_japanese_uses_character_rules():
    rng = random.Random(4)
    batch = DocBatch([japanese(rng), prose(rng)])
    assert batch.no_space.tolist() == [True, False]
    ja_chars = len("".join(batch.texts[0].split()))
    assert batch.n_words[0] == ja_chars  # characters are the words of unspaced scripts


def test_batch_langid_equals_langid_classify():
    from langid.langid import LanguageIdentifier, model

    rng = random.Random(5)
    texts = (
        [prose(rng) for _ in range(5)]
        + [japanese(rng) for _ in range(5)]
        + DE_SENTENCES
        + ["", "x", "42 !!"]
    )
    ident = LanguageIdentifier.from_modelstring(model, norm_probs=False)
    expected = [ident.classify(t.encode("utf-8")[:1024])[0] for t in texts]
    assert batch_langid(1024).classify(texts).tolist() == expected


class NoShouting(DocumentFilter):
    name = "shouting"

    def keep(self, batch):
        return batch.count_chars(r"\p{Lu}") <= 0.5 * np.maximum(batch.count_chars(r"\pL"), 1)


def test_user_filter_plugs_in_by_config_and_by_instance():
    rng = random.Random(6)
    texts = {"calm": prose(rng), "loud": prose(rng).upper()}
    cfg = CurateConfig(filters=FilterConfig(custom=["tests.curator.test_filters:NoShouting"]))
    assert _reasons(ChunkProcessor(cfg), texts) == {"calm": None, "loud": "shouting"}
    assert _reasons(ChunkProcessor(CurateConfig(), [NoShouting()]), texts) == {
        "calm": None,
        "loud": "shouting",
    }
    assert build_filters(cfg.filters)[-1].name == "shouting"


def test_disabled_rules_are_skipped():
    cfg = FilterConfig(min_words=None, max_words=None, languages=None, lorem_ipsum=False)
    names = {f.name for f in build_filters(cfg)}
    assert not names & {"word_count", "language", "lorem_ipsum"}
