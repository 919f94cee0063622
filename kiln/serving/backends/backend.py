"""Where the model runs behind the REST app: inside the Serve replica (`local`,
`local.py`) or in a Triton server reached over gRPC (`triton`, `triton.py`).
Both speak one small async interface, `Backend`, over `Job`s: one prompt, one sequence to make.

A backend checks a job against the model before it joins a batch (`prepare`: the prompt encodes,
its tokens are in the vocabulary, prompt + max_tokens fit the context), and a job that still
fails inside a batch fails alone: `complete` returns each job's own result or raises its own
error, never a neighbour's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from kiln.engine.config import BatchingConfig

__all__ = ["Backend", "BatchingConfig", "Job", "Prompt", "Result"]


if TYPE_CHECKING:
    from kiln.engine.logprobs import TokenScore
    from kiln.engine.sampler import SamplingParams

Prompt = str | list[int]


@dataclass
class Job:
    """One sequence to generate: the prompt as sent (text or token ids), its parameters, and
    its token ids once `prepare` knows them (local backend)."""

    prompt: Prompt
    params: SamplingParams
    prompt_ids: list[int] | None = None
    cache_salt: str | None = None  # shares cached prefixes only with jobs of the same salt
    lora: str | None = None  # the LoRA adapter it is decoded with (None: the base model)
    # set by a backend's `stream` when it ends: text deltas are not tokens (bytes merge,
    # stop strings are held back), so only the backend knows why and after how many tokens
    finish_reason: Literal["stop", "length"] | None = None
    completion_tokens: int | None = None


@dataclass
class Result:
    """One finished completion, whichever backend made it (token counts None when unknown)."""

    text: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_ids: list[int] | None = None
    token_ids: list[int] | None = field(default=None, repr=False)
    ended_by_eos: bool = False  # an end-of-text token (not in token_ids) ended it


class Backend(Protocol):
    model_name: str
    context_length: int | None  # the model's context in tokens, when known
    chat_template: str | None  # tokenizer_config.json's, when the model has one
    special_tokens: dict[str, str]  # bos_token / eos_token ... for the chat template
    eos_token_ids: set[int]  # tokens that end a completion (empty when unknown)

    async def prepare(
        self, prompt: Prompt, params: SamplingParams, *, truncate: int | None, fit_context: bool
    ) -> Job: ...

    async def complete(self, jobs: list[Job]) -> list[Result]: ...

    def stream(self, job: Job) -> AsyncIterator[str]: ...

    async def score(self, ids: list[int], top: int) -> list[TokenScore]: ...

    def token_texts(self, ids: list[int]) -> list[str]: ...

    def token_bytes(self, ids: list[int]) -> list[bytes]: ...

    async def ready(self) -> bool: ...

    def stats(self) -> dict[str, int]: ...

    async def close(self) -> None: ...
