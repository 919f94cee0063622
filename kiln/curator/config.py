"""Typed configuration of the curator: readers, cleaning, filters, dedup, engines and output.

Every threshold is a field; `None` switches that rule off. The YAML `curate` stage config and
`kiln curate --config FILE` both load into `CurateConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kiln.curator.dedup.config import DedupConfig
from kiln.curator.section import Section
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


class ReadConfig(Section):
    text_field: str = Field("text", description="Input field holding the document text.")
    id_field: str = Field(
        "id", description="Input field holding the document id (made from the content if absent)."
    )
    source_field: str = Field(
        "source", description="Input field holding the document's source (kept in the output)."
    )
    url_field: str = Field("url", description="the document's URL (filters.url_blocklist)")
    max_doc_chars: int = Field(
        1_000_000, gt=0, description="longer documents go to rejected/ as too_large"
    )
    chunk_docs: int = Field(2000, gt=0, description="documents per streamed batch")
    split_bytes: int = Field(
        32 << 20, gt=0, description="plain JSONL files are split into byte ranges this big"
    )
    text_files_per_task: int = Field(500, gt=0, description="Plain .txt files read by one task.")


class CleanConfig(Section):
    fix_unicode: bool = Field(True, description="Repair mojibake with ftfy.")
    normalization: Literal["NFC", "NFKC", "none"] = Field(
        "NFC", description="Unicode normalization form (none: leave the text as read)."
    )
    remove_control_chars: bool = Field(
        True, description="Delete control characters other than newline and tab."
    )
    normalize_whitespace: bool = Field(
        True, description="Collapse runs of spaces and blank lines; strip line ends."
    )
    boilerplate_lines: bool = Field(
        True, description="Drop lines holding a boilerplate_phrases phrase (C4)."
    )
    boilerplate_phrases: list[str] = Field(
        default_factory=lambda: list(C4_POLICY_PHRASES),
        description="Lower-case phrases marking boilerplate lines (cookie and policy notices).",
    )


PiiKind = Literal["secret", "email", "iban", "credit_card", "my_number", "ip", "phone", "postcode"]


class PiiConfig(Section):
    """PII detection after cleaning, before the filters (docs/curator.md lists each type)."""

    enabled: bool = Field(False, description="Look for PII in every document.")
    mode: Literal["redact", "drop", "flag"] = Field(
        "redact",
        description="redact: replace each item by its type's tag; drop: reject documents holding "
        "any (reason pii); flag: keep them unchanged and only count",
    )
    kinds: list[PiiKind] = Field(
        default_factory=lambda: list(PiiKind.__args__), description="PII types looked for."
    )
    tags: dict[PiiKind, str] = Field(
        default_factory=dict,
        description="replacement per type (default <EMAIL>, <PHONE_NUMBER>, <IP_ADDRESS>, "
        "<CREDIT_CARD>, <IBAN>, <MY_NUMBER>, <POSTCODE>, <SECRET>)",
    )


class CodeFilterConfig(Section):
    """Rules for source code (NeMo Curator / StarCoder defaults). `None` disables a rule."""

    min_lines: int | None = Field(10, description="Files with fewer lines are dropped.")
    max_lines: int | None = Field(20_000, description="Files with more lines are dropped.")
    max_line_length: int | None = Field(1000, description="characters of the longest line")
    max_mean_line_length: float | None = Field(
        100.0, description="Files whose mean line length (characters) is above are dropped."
    )
    min_alpha_fraction: float | None = Field(0.25, description="letters / characters")
    min_comment_ratio: float | None = Field(0.01, description="comment characters / characters")
    max_comment_ratio: float | None = Field(
        0.85, description="Comment characters / characters above which a file is dropped."
    )
    xml_header: bool = Field(True, description="drop files that start with an XML declaration")


# The prose rules `preset: code` switches off (each can still be set explicitly).
PROSE_RULES = {
    "min_words": None,
    "max_words": None,
    "min_mean_word_length": None,
    "max_mean_word_length": None,
    "ja_min_mean_word_length": None,
    "ja_max_mean_word_length": None,
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


class FilterConfig(Section):
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
    min_words: int | None = Field(
        50, description="Documents with fewer words are dropped (Gopher)."
    )
    max_words: int | None = Field(
        100_000, description="Documents with more words are dropped (Gopher)."
    )
    min_mean_word_length: float | None = Field(
        3.0, description="Min mean word length in characters (Gopher)."
    )
    max_mean_word_length: float | None = Field(
        10.0, description="Max mean word length in characters (Gopher)."
    )
    max_symbol_word_ratio: float | None = Field(
        0.1, description="Max ratio of '#' and '...' symbols to words (Gopher)."
    )
    max_bullet_line_ratio: float | None = Field(
        0.9, description="Max share of lines starting with a bullet (Gopher)."
    )
    max_ellipsis_line_ratio: float | None = Field(
        0.3, description="Max share of lines ending in an ellipsis (Gopher)."
    )
    min_alpha_word_ratio: float | None = Field(
        0.8, description="Min share of words containing a letter (Gopher)."
    )
    max_non_alnum_ratio: float | None = Field(
        0.35, description="Max share of characters that are neither letters, digits nor spaces."
    )
    max_digit_ratio: float | None = Field(
        0.15, description="Max share of characters that are digits."
    )
    max_dup_line_fraction: float | None = Field(
        0.3, description="Max share of lines that duplicate another line (Gopher)."
    )
    max_dup_line_char_fraction: float | None = Field(
        0.2, description="Max share of characters in duplicated lines (Gopher)."
    )
    max_dup_para_fraction: float | None = Field(
        0.3, description="Max share of paragraphs that duplicate another (Gopher)."
    )
    max_dup_para_char_fraction: float | None = Field(
        0.2, description="Max share of characters in duplicated paragraphs (Gopher)."
    )
    top_ngram_char_fraction: dict[int, float] | None = Field(
        default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16},
        description="n -> max share of characters in the most frequent n-gram (Gopher).",
    )
    dup_ngram_char_fraction: dict[int, float] | None = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
        description="n -> max share of characters in duplicated n-grams (Gopher).",
    )
    min_terminal_punct_line_ratio: float | None = Field(
        0.1, description="Min share of lines ending in terminal punctuation (C4)."
    )
    lorem_ipsum: bool = Field(True, description="Drop documents containing 'lorem ipsum' (C4).")
    max_javascript_line_ratio: float | None = Field(
        0.2, description="Max share of lines mentioning 'javascript' (C4)."
    )
    max_curly_brace_ratio: float | None = Field(
        0.01, description="Max share of characters that are { or } (C4 drops any)."
    )
    max_url_char_ratio: float | None = Field(
        0.2, description="Max share of characters inside URLs."
    )
    languages: list[str] | None = Field(
        default_factory=lambda: ["en", "ja"],
        description="Language codes to keep (fastText langid); null keeps every language.",
    )
    language_bytes: int = Field(
        1024, gt=0, description="langid reads this many UTF-8 bytes of each doc"
    )
    japanese_words: Literal["characters", "tokenizer"] = Field(
        "characters",
        description="Japanese documents' words: one per character, or MeCab (fugashi + "
        "unidic-lite, the `ja` extra) words",
    )
    ja_min_mean_word_length: float | None = Field(
        1.5, description="japanese_words: tokenizer: min mean word length of Japanese documents"
    )
    ja_max_mean_word_length: float | None = Field(
        6.0, description="japanese_words: tokenizer: max mean word length of Japanese documents"
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
    decontaminate_ngram: int = Field(
        13, gt=0, description="Token n-gram length matched against the decontaminate sets."
    )
    decontaminate_min_ngram: int = Field(
        8, gt=0, description="shorter eval items of at least this many tokens match whole"
    )
    quality_model: str | None = Field(
        None, description="a `kiln classify` quality model folder: reject low scores as quality"
    )
    quality_threshold: float = Field(
        0.5, ge=0, le=1, description="quality_model score below which a document is rejected."
    )
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


class OutputConfig(Section):
    shard_docs: int = Field(50_000, gt=0, description="documents per output shard")
    seed: int = Field(
        0, description="Seed of the shuffle that spreads kept documents across shards."
    )
    compression: str = Field("zstd", description="Parquet compression codec of the shards.")
    plot: bool = Field(
        True, description="Write the filter and dedup charts (PNG) beside the report."
    )


class CurateConfig(StageConfig):
    input: list[str] = Field(default_factory=list, description="files, folders or globs")
    read: ReadConfig = Field(
        default_factory=ReadConfig, description="Input fields and how files are split into tasks."
    )
    clean: CleanConfig = Field(
        default_factory=CleanConfig, description="Text cleaning applied before filtering."
    )
    pii: PiiConfig = Field(
        default_factory=PiiConfig, description="PII redaction, dropping or flagging."
    )
    filters: FilterConfig = Field(
        default_factory=FilterConfig,
        description="Quality, repetition, language and decontamination rules.",
    )
    dedup: DedupConfig = Field(
        default_factory=DedupConfig,
        description="Exact, fuzzy (MinHash) and semantic deduplication.",
    )
    output: OutputConfig = Field(
        default_factory=OutputConfig, description="How kept and rejected documents are written."
    )
    stream: Literal["ray", "inline"] = Field(
        "ray", description="Ray actors, or one in-process loop"
    )
    actors: int | None = Field(None, description="Ray actors (default: one per CPU of the machine)")
    backend: Literal["auto", "pandas", "cudf"] = Field(
        "auto",
        description="Dedup dataframes: pandas on CPU, cuDF on GPU, auto: cuDF where available.",
    )
    cluster: Literal["local", "ray"] = Field(
        "local", description="Dask scheduler: threads here, or Dask-on-Ray"
    )
    dask_partitions: int | None = Field(
        None, description="dedup partitions (default: one per 250k documents)"
    )
    rmm_async: bool = Field(
        True, description="cuDF backend: RMM's asynchronous memory pool on each GPU worker."
    )
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
