"""The KServe v2 (Open Inference Protocol) router: health, server and model metadata, model
config (Triton's JSON form, what `tritonclient`'s `get_model_config` reads), readiness,
statistics and `infer` over the backend in `request.app.state`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kiln.serving.api.kserve.protocol import ModelMetadata
from kiln.serving.api.kserve.tensors import (
    INPUTS,
    OUTPUTS,
    TEXT_INPUT,
    infer_response,
    infer_to_generation,
    parse_infer_body,
)
from kiln.serving.api.params import (
    backend_of,
    limits_of,
    prepare_jobs,
    require_model,
    sampling_params,
)

router = APIRouter(prefix="/v2")

# KServe datatypes as Triton's model config spells them
CONFIG_TYPES = {"BYTES": "TYPE_STRING", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64"}
CONFIG_TYPES |= {"FP32": "TYPE_FP32", "BOOL": "TYPE_BOOL"}


@router.get("/health/live")
async def live():
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request):
    ok = await backend_of(request).ready()
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("")
async def server_metadata():
    return {"name": "kiln", "version": "1", "extensions": ["binary_tensor_data", "generate"]}


@router.get("/models/{model}")
@router.get("/models/{model}/versions/{version}")
async def model_metadata(model: str, request: Request, version: str | None = None) -> ModelMetadata:
    require_model(request, model)
    return ModelMetadata(name=backend_of(request).model_name, inputs=INPUTS, outputs=OUTPUTS)


@router.get("/models/{model}/config")
@router.get("/models/{model}/versions/{version}/config")
async def model_config(model: str, request: Request, version: str | None = None):
    """The model's configuration in Triton's JSON form (KServe v2's model configuration)."""
    require_model(request, model)

    def tensor(t, optional: bool) -> dict:
        out = {"name": t.name, "data_type": CONFIG_TYPES[t.datatype], "dims": t.shape}
        return out | ({"optional": True} if optional else {})

    return {
        "name": backend_of(request).model_name,
        "platform": "kiln",
        "backend": "kiln",
        "versions": ["1"],
        "max_batch_size": 0,
        "input": [tensor(t, t.name != TEXT_INPUT) for t in INPUTS],
        "output": [tensor(t, False) for t in OUTPUTS],
        "model_transaction_policy": {"decoupled": False},
        "parameters": {"max_model_len": {"string_value": str(backend_of(request).context_length)}},
    }


@router.get("/models/{model}/ready")
@router.get("/models/{model}/versions/{version}/ready")
async def model_ready(model: str, request: Request, version: str | None = None):
    require_model(request, model)
    backend = backend_of(request)
    ok = await backend.ready()
    return JSONResponse({"name": backend.model_name, "ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{model}/stats")
async def model_stats(model: str, request: Request):
    """Triton's statistics extension, abridged: jobs completed and batches run by this replica."""
    require_model(request, model)
    backend = backend_of(request)
    return {"model_stats": [{"name": backend.model_name, "version": "1", **backend.stats()}]}


@router.post(
    "/models/{model}/infer",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
@router.post("/models/{model}/versions/{version}/infer", include_in_schema=False)
async def infer(model: str, request: Request, version: str | None = None):
    require_model(request, model)
    backend = backend_of(request)
    body = await request.body()
    req, values = parse_infer_body(body, request.headers.get("inference-header-content-length"))
    prompts, fields = infer_to_generation(req, values)
    params = sampling_params(limits_of(request), prompts, fields)
    results = await backend.complete(await prepare_jobs(backend, prompts, params))
    shape = next(t.shape for t in req.inputs if t.name == TEXT_INPUT)
    content, headers = infer_response(backend.model_name, req, [r.text for r in results], shape)
    return Response(content, headers=headers)
