"""The `speculative` options of the engine (vLLM's `speculative_config`): which drafter proposes
tokens and how many the target model verifies per step."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeConfig(BaseModel):
    """Speculative decoding: a drafter proposes `num_speculative_tokens` tokens per decoding
    row, the served model checks them all in one forward and keeps the longest run it agrees
    with (greedy: token-identical output; sampled: the same distribution, by rejection
    sampling). `ngram` drafts from the sequence's own text (prompt lookup, no extra model);
    `draft_model` runs a smaller model with the same vocabulary (`model`: its directory)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["ngram", "draft_model"] | None = Field(
        None, description="ngram or draft_model (default: draft_model when `model` is set)"
    )
    model: str | None = Field(
        None, description="draft_model: a smaller exported model with the same vocabulary"
    )
    num_speculative_tokens: int = Field(
        4, ge=1, le=16, description="tokens drafted (and verified in one forward) per step"
    )
    disable_by_batch_size: int | None = Field(
        None,
        ge=1,
        description="decode plainly in steps where this many rows or more decode (a CPU's "
        "matmuls already busy: verifying k+1 positions per row costs more than it saves)",
    )
    prompt_lookup_max: int = Field(
        4, ge=1, description="ngram: longest suffix of the text looked up earlier in it"
    )
    prompt_lookup_min: int = Field(
        2, ge=1, description="ngram: shortest suffix worth a lookup (shorter ones guess worse)"
    )

    @model_validator(mode="after")
    def _resolve_method(self) -> SpeculativeConfig:
        if self.method is None:
            self.method = "draft_model" if self.model else "ngram"
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative.model: method draft_model needs a draft model path")
        if self.method == "ngram" and self.model:
            raise ValueError("speculative.model: method ngram uses no model (drop one of them)")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) exceeds "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self
