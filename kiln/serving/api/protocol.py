"""What every protocol shares: the client-error type, the deployment's limits, and the typed,
range-checked sampling fields that a request must pass before it reaches the model.

Ranges are finite on purpose: a temperature of 1e-45 or a seed of 2**64 is valid JSON, but
would overflow inside sampling (and fail every request batched with it). Text must be
valid Unicode: JSON may carry a lone surrogate ("\\ud800") that no tokenizer can encode.
The OpenAI wire models are in `openai/protocol.py`, the KServe v2 ones in `kserve/protocol.py`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
)

TEMPERATURE_MIN = 1e-5  # below this (but above 0) logits / temperature overflows float32
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed
TOP_LOGPROBS_MAX = 20  # as OpenAI


class RequestError(Exception):
    """A client error: becomes a 4xx JSON response in the protocol's error format."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


class Limits(BaseModel):
    """Per-deployment bounds on what one request may ask for."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(512, ge=1, description="largest max_tokens a request may ask for")
    max_prompt_chars: int = Field(16_384, ge=1, description="longest prompt, in characters")
    max_prompts_per_request: int = Field(64, ge=1, description="prompts in one request (batch)")
    max_body_bytes: int = Field(
        8 << 20, ge=1, description="largest request body, in bytes (413 beyond)"
    )

    def check(
        self, prompts: list, max_new_tokens: int, field: str = "max_tokens", minimum: int = 1
    ) -> None:
        """Prompts are text or token-id lists; the model's context is the backend's to check."""
        if not prompts:
            raise RequestError("no prompt given", param="prompt")
        if len(prompts) > self.max_prompts_per_request:
            raise RequestError(
                f"{len(prompts)} prompts in one request; at most {self.max_prompts_per_request}",
                param="prompt",
            )
        for p in prompts:
            if len(p) > self.max_prompt_chars:
                unit = "characters" if isinstance(p, str) else "tokens"
                raise RequestError(
                    f"prompt has {len(p)} {unit}; at most {self.max_prompt_chars}",
                    param="prompt",
                )
        if max_new_tokens < minimum:
            raise RequestError(
                f"{field} must be at least {minimum} (got {max_new_tokens})", param=field
            )
        if max_new_tokens > self.max_new_tokens:
            raise RequestError(
                f"{field} must be at most {self.max_new_tokens} (got {max_new_tokens})", param=field
            )


# ------------------------------------------------------------------------- checked field types


def valid_unicode(text: str) -> str:
    """Reject what UTF-8 cannot encode (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode (character {e.start} is a lone surrogate)") from None
    return text


def _temperature_floor(v: float) -> float:
    if 0 < v < TEMPERATURE_MIN:
        raise ValueError(f"must be 0 (greedy) or at least {TEMPERATURE_MIN} (got {v})")
    return v


# ranges live in Field(...) so that the OpenAPI schema states them too
Text = Annotated[StrictStr, AfterValidator(valid_unicode)]
Temperature = Annotated[
    StrictFloat, Field(ge=0, allow_inf_nan=False), AfterValidator(_temperature_floor)
]
TopP = Annotated[StrictFloat, Field(gt=0, le=1)]
TopK = Annotated[StrictInt, Field(ge=0)]
Seed = Annotated[StrictInt, Field(ge=0, le=SEED_MAX)]
MaxTokens = Annotated[StrictInt, Field(ge=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]
RepetitionPenalty = Annotated[StrictFloat, Field(gt=0, le=10)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class SamplingFields(BaseModel):
    """Sampling fields as every protocol spells them, each type- and range-checked. None means
    "the route's default". Subclasses add their protocol's own fields."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def merged(self, other: SamplingFields) -> SamplingFields:
        """These fields, overridden by the ones `other` sets."""
        return self.model_copy(update=other.model_dump(exclude_none=True))


# OpenAI's `error.code` is a string (or null); the HTTP status carries the number. Inside a
# stream, where the status is already 200, the code says which failure it was.
ERROR_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout",
}


def openai_error(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(
        status, "invalid_request_error"
    )
    if status >= 500:
        kind = "server_error"
    code = ERROR_CODES.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def kserve_error(message: str) -> dict[str, Any]:
    return {"error": message}
