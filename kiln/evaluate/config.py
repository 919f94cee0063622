"""The evaluate stage's / `kiln eval`'s options (one pydantic model for both)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln.engine.config import BatchingConfig
from kiln.platform.stage import StageConfig

DEFAULT_TASKS = ["kiln_mc_en", "kiln_mc_ja", "kiln_qa_gen"]


class PerplexityConfig(BaseModel):
    """Held-out perplexity on a split of the TokenDataset, computed with the model directly."""

    model_config = ConfigDict(extra="forbid")

    split: Literal["valid", "test", "train"] = Field("valid", description="split to score")
    seq_len: int | None = Field(
        None, ge=1, description="window length (default: the model's context, at most 1024)"
    )
    batch_size: int = Field(4, ge=1, description="windows per forward")
    max_tokens: int | None = Field(
        262_144, ge=2, description="score at most this many tokens of the split (None: all)"
    )


class EvaluateConfig(StageConfig):
    tasks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TASKS),
        description="shipped task names (kiln_mc_en, kiln_mc_ja, kiln_qa_gen) or lm-eval task "
        "YAML files; [] for perplexity only",
    )
    api: Literal["completions", "chat"] = Field(
        "completions",
        description="lm-eval model: local-completions (log-likelihood + generation) or "
        "local-chat-completions (generation through the chat template)",
    )
    url: str | None = Field(
        None, description="endpoint base URL (default: the endpoint input, else one is started)"
    )
    api_key_env: str | None = Field(None, description="env variable holding the endpoint's key")
    limit: int | None = Field(None, ge=1, description="at most this many items per task")
    num_fewshot: int | None = Field(None, ge=0, description="few-shot examples per prompt")
    num_concurrent: int = Field(4, ge=1, description="requests lm-eval keeps in flight")
    max_length: int | None = Field(
        None, ge=2, description="context lm-eval truncates to (default: the model's)"
    )
    timeout_s: int = Field(300, ge=1, description="per request")
    perplexity: PerplexityConfig | None = Field(
        default_factory=PerplexityConfig,
        description="held-out perplexity when a TokenDataset is given (null: skip)",
    )
    batching: BatchingConfig = Field(
        default_factory=BatchingConfig, description="batching of the endpoint this stage starts"
    )
    num_cpus: float = Field(1.0, gt=0, description="CPUs of the endpoint this stage starts")
