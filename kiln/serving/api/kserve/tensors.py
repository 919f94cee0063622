"""KServe v2 / Open Inference Protocol tensors <-> prompts and sampling fields.

Supports Triton's binary tensor data extension (what `tritonclient.http` sends by default): the
body is a JSON header of `Inference-Header-Content-Length` bytes followed by each input's raw
bytes (`parameters.binary_data_size`); BYTES elements are a 4-byte little-endian length + bytes.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
from pydantic import ValidationError

from kiln.serving.api.kserve.protocol import (
    InferRequest,
    RequestParameters,
    TensorMetadata,
)
from kiln.serving.api.protocol import RequestError, SamplingFields, valid_unicode

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"

NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}

# Optional sampling inputs (vLLM's Triton backend convention takes them in `sampling_parameters`).
SAMPLING_INPUTS = [
    TensorMetadata(name="max_tokens", datatype="INT32", shape=[1]),
    TensorMetadata(name="temperature", datatype="FP32", shape=[1]),
    TensorMetadata(name="top_k", datatype="INT32", shape=[1]),
    TensorMetadata(name="top_p", datatype="FP32", shape=[1]),
    TensorMetadata(name="seed", datatype="INT64", shape=[1]),
    TensorMetadata(name="stop", datatype="BYTES", shape=[-1]),
    TensorMetadata(name="sampling_parameters", datatype="BYTES", shape=[1]),
]
INPUTS = [TensorMetadata(name=TEXT_INPUT, datatype="BYTES", shape=[-1]), *SAMPLING_INPUTS]
OUTPUTS = [TensorMetadata(name=TEXT_OUTPUT, datatype="BYTES", shape=[-1])]


def parse_sampling(raw: Any, where: str) -> SamplingFields:
    """Validate a `parameters` object (or vLLM's JSON) into typed sampling fields (400 if bad)."""
    if raw is None:
        return SamplingFields()
    if not isinstance(raw, dict):
        raise RequestError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    try:
        fields = RequestParameters.model_validate(raw).resolved()
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise RequestError(f"{where}.{field}: {err['msg']}", param=field) from None
    return SamplingFields.model_validate(
        fields.model_dump(include=set(SamplingFields.model_fields), exclude_none=True)
    )


def _decode_bytes_elements(raw: bytes, name: str) -> list[bytes]:
    out, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise RequestError(f"input {name!r}: truncated BYTES element", param=name)
        (n,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + n > len(raw):
            raise RequestError(f"input {name!r}: truncated BYTES element", param=name)
        out.append(raw[offset : offset + n])
        offset += n
    return out


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major elements of nested JSON lists (iterative: any depth, no recursion limit)."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            flat.append(x)
        else:
            stack.pop()
    return flat


def parse_infer_body(
    body: bytes, header_length: str | None
) -> tuple[InferRequest, dict[str, list]]:
    """Split a KServe infer body into the request header and each input's flat list of values."""
    try:
        n = int(header_length) if header_length is not None else len(body)
    except ValueError:
        raise RequestError("Inference-Header-Content-Length must be an integer") from None
    if n < 0 or n > len(body):
        raise RequestError("Inference-Header-Content-Length is larger than the body")
    try:
        req = InferRequest.model_validate_json(body[:n])
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise RequestError(f"{where}: {err['msg']}") from None
    binary, offset = body[n:], 0
    values: dict[str, list] = {}
    for t in req.inputs:
        expected = math.prod(t.shape) if t.shape else 1
        if any(d < 0 for d in t.shape):
            raise RequestError(
                f"input {t.name!r}: negative dimension in shape {t.shape}", param=t.name
            )
        size = (t.parameters or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise RequestError(
                    f"input {t.name!r}: binary_data_size exceeds the body", param=t.name
                )
            raw = binary[offset : offset + size]
            offset += size
            if t.datatype == "BYTES":
                vals: list = _decode_bytes_elements(raw, t.name)
            elif t.datatype in NUMPY_DTYPES:
                dtype = np.dtype(NUMPY_DTYPES[t.datatype])
                if len(raw) % dtype.itemsize:
                    raise RequestError(f"input {t.name!r}: size is not a multiple of {t.datatype}")
                vals = np.frombuffer(raw, dtype=dtype).tolist()
            else:
                raise RequestError(
                    f"input {t.name!r}: unknown datatype {t.datatype!r}", param=t.name
                )
        elif t.data is not None:
            vals = _flatten(t.data)
        else:
            raise RequestError(f"input {t.name!r}: no data", param=t.name)
        if len(vals) != expected:
            raise RequestError(
                f"input {t.name!r}: shape {t.shape} needs {expected} elements, got {len(vals)}",
                param=t.name,
            )
        values[t.name] = vals
    return req, values


def _as_text(v: Any, name: str) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"input {name!r}: not valid UTF-8", param=name) from None
    if isinstance(v, str):
        try:
            return valid_unicode(v)
        except ValueError as e:
            raise RequestError(f"input {name!r}: {e}", param=name) from None
    raise RequestError(
        f"input {name!r}: expected BYTES (strings), got {type(v).__name__}", param=name
    )


def infer_to_generation(
    req: InferRequest, values: dict[str, list]
) -> tuple[list[str], SamplingFields]:
    """Prompts from `text_input`, sampling fields from the optional inputs and `parameters`."""
    known = {t.name: t for t in INPUTS}
    datatypes = {t.name: t.datatype for t in req.inputs}
    for t in req.inputs:
        if t.name not in known:
            raise RequestError(
                f"unknown input {t.name!r}; expected {TEXT_INPUT!r} and optionally {sorted(known)}",
                param=t.name,
            )
        if known[t.name].datatype == "BYTES" and t.datatype != "BYTES":
            raise RequestError(f"input {t.name!r}: datatype must be BYTES, got {t.datatype}")
        if known[t.name].datatype != "BYTES" and t.datatype == "BYTES":
            raise RequestError(f"input {t.name!r}: datatype must be numeric, got BYTES")
        if t.datatype != "BYTES" and t.datatype not in NUMPY_DTYPES:
            raise RequestError(f"input {t.name!r}: unknown datatype {t.datatype!r}", param=t.name)
    if TEXT_INPUT not in values:
        raise RequestError(f"missing input {TEXT_INPUT!r}", param=TEXT_INPUT)
    prompts = [_as_text(v, TEXT_INPUT) for v in values[TEXT_INPUT]]

    fields = parse_sampling(req.parameters, "parameters")
    if "sampling_parameters" in values:
        if len(values["sampling_parameters"]) != 1:
            raise RequestError("input 'sampling_parameters': expected one JSON string")
        text = _as_text(values["sampling_parameters"][0], "sampling_parameters")
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise RequestError("input 'sampling_parameters': not valid JSON") from None
        if not isinstance(raw, dict):
            raise RequestError("input 'sampling_parameters': expected a JSON object")
        fields = fields.merged(parse_sampling(raw, "sampling_parameters"))
    scalars: dict[str, Any] = {}
    for name in SCALAR_INPUTS:
        if name in values:
            scalars[name] = _scalar(name, datatypes[name], values[name])
    if "stop" in values:
        scalars["stop"] = [_as_text(v, "stop") for v in values["stop"]]
    return prompts, fields.merged(parse_sampling(scalars, "inputs"))


SCALAR_INPUTS = ("max_tokens", "temperature", "top_k", "top_p", "seed")
INTEGER_INPUTS = ("max_tokens", "top_k", "seed")


def _scalar(name: str, datatype: str, vals: list) -> int | float:
    """The one value of a numeric input: a JSON number (never a string, null, bool or object)
    of an integer datatype for integer fields."""
    if len(vals) != 1:
        raise RequestError(f"input {name!r}: expected one value, got {len(vals)}", param=name)
    v = vals[0]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RequestError(f"input {name!r}: expected a number, got {type(v).__name__}", param=name)
    if name in INTEGER_INPUTS:
        if not (datatype.startswith(("INT", "UINT"))) or not isinstance(v, int):
            raise RequestError(
                f"input {name!r}: expected an integer ({datatype} {v!r})", param=name
            )
        return int(v)
    return float(v)


def encode_bytes_tensor(items: list[str]) -> bytes:
    parts = []
    for s in items:
        b = s.encode("utf-8")
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def infer_response(
    model_name: str, req: InferRequest, texts: list[str], shape: list[int]
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary when the client asked for binary outputs."""
    wanted = req.outputs or []
    for o in wanted:
        if o.name != TEXT_OUTPUT:
            raise RequestError(f"unknown output {o.name!r}; this model returns {TEXT_OUTPUT!r}")
    binary = bool((req.parameters or {}).get("binary_data_output", False))
    if wanted:
        binary = bool((wanted[0].parameters or {}).get("binary_data", binary))
    out: dict[str, Any] = {"name": TEXT_OUTPUT, "datatype": "BYTES", "shape": shape}
    head: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": [out]}
    if req.id is not None:
        head["id"] = req.id
    if not binary:
        out["data"] = texts
        return json.dumps(head).encode(), {"content-type": "application/json"}
    raw = encode_bytes_tensor(texts)
    out["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps(head).encode()
    return header + raw, {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }
