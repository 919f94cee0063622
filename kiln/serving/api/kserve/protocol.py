"""KServe v2 (Open Inference Protocol) and Triton's generate extension, as pydantic models."""

from __future__ import annotations

import json
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from kiln.serving.api.protocol import RequestError, SamplingFields, Text


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
    """`POST /v2/models/{m}/infer` (JSON part; binary tensor data is attached by `tensors.py`)."""

    model_config = ConfigDict(extra="ignore")

    id: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInputTensor]
    outputs: list[InferRequestedOutput] | None = None


class RequestParameters(SamplingFields):
    """Sampling fields in a KServe / Triton `parameters` object or vLLM's `sampling_parameters`
    JSON. Triton's reserved parameters (priority, timeout, binary_data_output, ...) are ignored,
    as Triton does; `max_new_tokens` is TensorRT-LLM's name for `max_tokens`."""

    model_config = ConfigDict(extra="ignore")

    max_new_tokens: StrictInt | None = Field(None, ge=1)

    def resolved(self) -> RequestParameters:
        if self.max_tokens is None and self.max_new_tokens is not None:
            return self.model_copy(update={"max_tokens": self.max_new_tokens})
        return self


class GenerateRequest(SamplingFields):
    """Triton's `POST /v2/models/{m}/generate`: `text_input` plus sampling fields at the top level
    or under `parameters` (both forms are in use). Unknown top-level fields are a 400, as Triton
    rejects inputs the model does not have."""

    model_config = ConfigDict(extra="forbid")

    text_input: Text
    parameters: RequestParameters | None = None
    sampling_parameters: Text | None = None  # vLLM's Triton backend: the fields as a JSON string
    exclude_input_in_output: StrictBool = True
    stream: StrictBool = False
    id: StrictStr | None = None

    def fields(self) -> SamplingFields:
        """Top-level fields over `parameters` over `sampling_parameters`."""
        top = SamplingFields.model_validate(
            self.model_dump(include=set(SamplingFields.model_fields), exclude_none=True)
        )
        inner = (self.parameters or RequestParameters()).resolved()
        if self.sampling_parameters is not None:
            try:
                raw = json.loads(self.sampling_parameters)
            except (json.JSONDecodeError, RecursionError):
                raise RequestError("sampling_parameters: not valid JSON") from None
            if not isinstance(raw, dict):
                raise RequestError("sampling_parameters: expected a JSON object")
            try:
                vllm = RequestParameters.model_validate(raw).resolved()
            except ValidationError as e:
                err = e.errors()[0]
                field = ".".join(str(p) for p in err["loc"])
                raise RequestError(f"sampling_parameters.{field}: {err['msg']}") from None
            inner = vllm.merged(inner)
        base = SamplingFields.model_validate(
            inner.model_dump(include=set(SamplingFields.model_fields), exclude_none=True)
        )
        return base.merged(top)
