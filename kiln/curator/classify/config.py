"""Typed configuration of the `classify` stage (`kiln classify --config FILE`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.stage import StageConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FastTextConfig(_Section):
    """fastText supervised training; CJK characters are separate tokens, so `word_ngrams: 2`
    also gives Japanese character bigrams and `minn..maxn` sub-word character n-grams."""

    dim: int = Field(64, gt=0, description="Size of the word vectors.")
    epoch: int = Field(25, gt=0, description="Training passes over the data.")
    lr: float = Field(0.5, gt=0, description="Learning rate.")
    word_ngrams: int = Field(2, gt=0, description="Longest word n-gram used as a feature.")
    minn: int = Field(
        2, ge=0, description="Shortest character n-gram of sub-word features (0: none)."
    )
    maxn: int = Field(
        4, ge=0, description="Longest character n-gram of sub-word features (0: none)."
    )
    bucket: int = Field(200_000, gt=0, description="Hash buckets for word and character n-grams.")
    max_chars: int = Field(20_000, gt=0, description="characters of each document read")


class EmbeddingConfig(_Section):
    """A learned classifier over sentence embeddings (`classifier: embedding`): a frozen encoder's
    mean-pooled, unit-length vectors, then a logistic-regression (or one-hidden-layer MLP) head
    trained here with full-batch L-BFGS, so the same data and seed give the same head."""

    encoder: str = Field(
        "minilm",
        description="minilm (the MiniLM semantic dedup ships), a sentence-transformers BERT "
        "folder, or any Kiln-loadable LM (checkpoint, HF folder, .gguf or a package shipping one: "
        "its mean-pooled last hidden states)",
    )
    tokenizer: str | None = Field(
        None, description="an LM encoder's tokenizer.json or folder (default: the model's own)"
    )
    max_tokens: int = Field(
        128, gt=1, description="tokens embedded from the start of each document"
    )
    batch_size: int = Field(32, gt=0, description="Documents embedded per forward pass.")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="a BERT encoder's linear layers: auto (bf16 where the CPU has AMX or "
        "AVX-512-BF16, else fp32), bf16 or fp32",
    )
    hidden: int = Field(
        0,
        ge=0,
        description="0: logistic regression; > 0: an MLP head with this hidden width (64 pays "
        "from ~1k labelled rows; on a few dozen it overfits)",
    )
    steps: int = Field(100, gt=0, description="L-BFGS iterations of the head's training.")
    weight_decay: float = Field(1e-4, ge=0, description="L2 penalty on the head's weights.")


class KeepConfig(_Section):
    """Which documents stay: score >= threshold, the best `top_percent`, or NeMo Curator's
    Pareto sampling (keep when a Pareto(alpha) draw, seeded per document, exceeds 1 - score)."""

    method: Literal["threshold", "top_percent", "pareto", "all"] = Field(
        "threshold", description="threshold, top_percent, pareto, or all (score only)."
    )
    threshold: float = Field(
        0.5, ge=0, le=1, description="Keep documents scoring at least this (method threshold)."
    )
    top_percent: float = Field(
        30.0,
        gt=0,
        le=100,
        description="Keep this percentage of best-scoring documents (method top_percent).",
    )
    alpha: float = Field(
        3.0, gt=0, description="Pareto shape (method pareto): larger keeps fewer low scores."
    )
    domains: list[str] | None = Field(
        None, description="domain classifier: keep only these labels (default: keep all)"
    )


class PerplexityConfig(_Section):
    """CCNet-style perplexity under a Kiln model (`kind: perplexity`)."""

    model: str | None = Field(None, description="kiln checkpoint, HF folder or exported model")
    tokenizer: str | None = Field(None, description="the model's tokenizer.json")
    max_tokens: int = Field(512, gt=1, description="tokens of each document scored")
    batch_size: int = Field(8, gt=0, description="Documents scored per forward pass.")
    head_percent: float = Field(33.3, gt=0, lt=100, description="lowest-perplexity share: head")
    tail_percent: float = Field(33.3, gt=0, lt=100, description="highest-perplexity share: tail")
    keep_buckets: list[Literal["head", "middle", "tail"]] = Field(
        default_factory=lambda: ["head", "middle"],
        description="Perplexity buckets whose documents stay (head: lowest).",
    )


class ClassifyConfig(StageConfig):
    input: list[str] = Field(
        default_factory=list, description="corpus files or folders (Parquet, JSONL, .txt)"
    )
    kind: Literal["quality", "domain", "perplexity"] = Field(
        "quality",
        description="quality: high_quality vs. corpus text; domain: labelled examples; "
        "perplexity: under a model.",
    )
    high_quality: list[str] = Field(
        default_factory=list,
        description="quality: 'high quality' texts (files or folders) trained against a random "
        "sample of the corpus",
    )
    sample_docs: int = Field(
        20_000, gt=0, description="corpus documents drawn as the low-quality class"
    )
    labelled: str | list[str] | None = Field(
        None,
        description="labelled examples (`text_field`, `label_field`): JSONL or Parquet files, a "
        "folder or glob; domain: any labels; quality: high/low or numeric (`label_threshold`)",
    )
    text_field: str = Field("text", description="JSON/Parquet field holding the document text.")
    label_field: str = Field("label", description="JSON field of `labelled` holding the label.")
    label_threshold: float | None = Field(
        None,
        description="numeric labels (an annotator's 0-5 score): >= this is `high`, below `low` "
        "(FineWeb-Edu's cut is 3)",
    )
    classifier: Literal["fasttext", "embedding"] = Field(
        "fasttext",
        description="kind quality and domain: fastText over n-grams, or a head over sentence "
        "embeddings (`embedding`)",
    )
    embedding: EmbeddingConfig = Field(
        default_factory=EmbeddingConfig,
        description="Encoder and head settings (classifier embedding).",
    )
    model: str | None = Field(None, description="a trained classifier folder: skip training")
    held_out: float = Field(0.1, gt=0, lt=1, description="share of training data held out")
    fasttext: FastTextConfig = Field(
        default_factory=FastTextConfig,
        description="fastText training settings (kind quality and domain).",
    )
    keep: KeepConfig = Field(default_factory=KeepConfig, description="Which scored documents stay.")
    perplexity: PerplexityConfig = Field(
        default_factory=PerplexityConfig,
        description="Perplexity scoring settings (kind perplexity).",
    )
    seed: int = Field(0, description="Seed of the sampling and the train/held-out split.")
    cluster: Literal["local", "ray"] = Field(
        "local", description="score in this process, or in a Ray Data actor pool"
    )
    actors: int | None = Field(None, description="Ray Data actors (default: one per CPU)")
    histogram_bins: int = Field(20, gt=0, description="Bins of the score histogram in the report.")
