"""Wire formats of the REST endpoint: OpenAI completions, KServe v2 (Open Inference Protocol)
and Triton's generate extension, as pydantic models, plus the server's limits.

Request models validate types and ranges; limits that depend on the deployment (the largest
`max_tokens`, the longest prompt) are checked by `Limits.check` so the message names the limit.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


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

    def check(self, prompts: list[str], max_new_tokens: int, field: str = "max_tokens") -> None:
        if not prompts:
            raise RequestError("no prompt given", param="prompt")
        if len(prompts) > self.max_prompts_per_request:
            raise RequestError(
                f"{len(prompts)} prompts in one request; at most {self.max_prompts_per_request}",
                param="prompt",
            )
        for p in prompts:
            if len(p) > self.max_prompt_chars:
                raise RequestError(
                    f"prompt has {len(p)} characters; at most {self.max_prompt_chars}",
                    param="prompt",
                )
        if max_new_tokens < 1:
            raise RequestError(f"{field} must be at least 1 (got {max_new_tokens})", param=field)
        if max_new_tokens > self.max_new_tokens:
            raise RequestError(
                f"{field} must be at most {self.max_new_tokens} (got {max_new_tokens})", param=field
            )


# ---------------------------------------------------------------- OpenAI /v1/completions


class CompletionRequest(BaseModel):
    """OpenAI `POST /v1/completions`. Unknown fields are ignored, as OpenAI-compatible servers do;
    `top_k` and `seed` are accepted extensions (vLLM does the same)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    prompt: StrictStr | list[StrictStr]
    max_tokens: StrictInt | None = 16
    temperature: StrictFloat | StrictInt | None = 1.0
    top_p: StrictFloat | StrictInt | None = 1.0
    top_k: StrictInt | None = 0
    n: StrictInt = 1
    stream: StrictBool = False
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    echo: StrictBool = False
    user: StrictStr | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex[:24]}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kiln"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def openai_error(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(
        status, "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# ---------------------------------------------------------------- KServe v2 / Triton


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """`GET /v2/models/{m}`: the tensors `infer` takes and returns."""

    name: str
    versions: list[str] = ["1"]
    platform: str = "kiln"
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class InferInputTensor(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: StrictStr
    shape: list[StrictInt]
    datatype: StrictStr
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferRequestedOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: StrictStr
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    """`POST /v2/models/{m}/infer` (JSON part; binary tensor data is attached by `rest_kserve`)."""

    model_config = ConfigDict(extra="ignore")

    id: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInputTensor]
    outputs: list[InferRequestedOutput] | None = None


class GenerateRequest(BaseModel):
    """Triton's `POST /v2/models/{m}/generate`: `text_input` plus sampling fields at the top level
    or under `parameters` (both forms are in use)."""

    model_config = ConfigDict(extra="ignore")

    text_input: StrictStr
    parameters: dict[str, Any] | None = None
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_k: StrictInt | None = None
    top_p: StrictFloat | StrictInt | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False


def kserve_error(message: str) -> dict[str, Any]:
    return {"error": message}
