"""Dedup that would not fit says so before it starts, with the size it needs."""

from __future__ import annotations

import glob

import pytest

from kiln.curator import CurateConfig, curate
from kiln.curator.dedup.config import DedupConfig
from kiln.curator.dedup.memory import (
    GIB,
    available_memory_bytes,
    check_dedup_memory,
    dedup_memory_needs,
)
from kiln.platform.errors import ConfigError
from tests.curator.planted_corpus import make_corpus, write_jsonl


def test_needs_grow_with_documents_and_semantic_adds_its_embeddings():
    cfg = DedupConfig.model_validate({})
    small, large = dedup_memory_needs(1_000_000, cfg), dedup_memory_needs(10_000_000, cfg)
    assert list(small) == ["exact+fuzzy"]
    assert large["exact+fuzzy"] - small["exact+fuzzy"] == pytest.approx(9 * 0.43 * GIB, rel=2e-3)
    semantic = DedupConfig.model_validate({"semantic": {"enabled": True}})
    assert dedup_memory_needs(1_000_000, semantic)["semantic"] > 3 * 2**30 * 0.7  # ~2.9 GB
    off = DedupConfig.model_validate({"exact": False, "fuzzy": {"enabled": False}})
    assert dedup_memory_needs(10**9, off) == {}


def test_a_corpus_above_the_limit_is_one_line_naming_the_field_and_the_size():
    cfg = DedupConfig.model_validate({"memory_limit_mb": 2048})
    check_dedup_memory(2_000_000, cfg)  # 1.86 GiB: fits
    with pytest.raises(ConfigError) as err:
        check_dedup_memory(10_000_000, cfg)
    message = str(err.value)
    assert "\n" not in message
    assert "10,000,000 documents needs about 5.29 GiB" in message
    assert "dedup.memory_limit_mb = 2048" in message


def test_the_default_limit_is_the_machines_available_memory():
    assert available_memory_bytes() > 0
    check_dedup_memory(100_000, DedupConfig.model_validate({}))
    too_many = int(available_memory_bytes() / (0.43 * GIB / 1e6)) * 2
    with pytest.raises(ConfigError, match="80% of this machine's available memory"):
        check_dedup_memory(too_many, DedupConfig.model_validate({}))


def test_curate_stops_before_dedup_and_writes_no_shards(tmp_path):
    src = tmp_path / "in.jsonl"
    write_jsonl(make_corpus(seed=0, max_doc_chars=2000), str(src))
    cfg = CurateConfig.model_validate(
        {
            "input": [str(src)],
            "stream": "inline",
            "cluster": "local",
            "dedup": {"memory_limit_mb": 256},
        }
    )
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="dedup.memory_limit_mb = 256"):
        curate(cfg, str(out))
    assert glob.glob(str(out / "shard-*")) == []
    assert src.stat().st_size > 0  # the input is untouched
