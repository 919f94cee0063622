"""Triton's generate extension as a router: `POST /v2/models/{m}/generate` and
`generate_stream` (server-sent events; a failure mid-stream is sent as `{"error": ...}`, one
before the first token is a plain error answer: a down Triton server gives 503 + Retry-After)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from kiln.serving.api.kserve.protocol import GenerateRequest
from kiln.serving.api.params import (
    SSE_HEADERS,
    backend_of,
    limits_of,
    prepare_jobs,
    primed,
    require_model,
    sampling_params,
)
from kiln.serving.api.protocol import RequestError, kserve_error
from kiln.serving.backends.backend import Backend, Job

router = APIRouter(prefix="/v2")


async def _job(model: str, req: GenerateRequest, request: Request) -> Job:
    require_model(request, model)
    params = sampling_params(limits_of(request), [req.text_input], req.fields())
    (job,) = await prepare_jobs(backend_of(request), [req.text_input], params)
    return job


@router.post("/models/{model}/generate")
async def generate(model: str, req: GenerateRequest, request: Request):
    job = await _job(model, req, request)
    backend = backend_of(request)
    (result,) = await backend.complete([job])
    text = result.text if req.exclude_input_in_output else req.text_input + result.text
    out = {"model_name": backend.model_name, "model_version": "1", "text_output": text}
    return out | ({"id": req.id} if req.id is not None else {})


@router.post("/models/{model}/generate_stream")
async def generate_stream(model: str, req: GenerateRequest, request: Request):
    job = await _job(model, req, request)
    echo = "" if req.exclude_input_in_output else req.text_input
    backend = backend_of(request)
    stream = await primed(backend.stream(job))  # fails before headers: a plain error answer
    events = _events(backend, job, echo, stream)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(
    backend: Backend, job: Job, echo: str = "", stream: AsyncIterator[str] | None = None
) -> AsyncIterator[str]:
    async def deltas():
        if echo:
            yield echo
        async for delta in backend.stream(job) if stream is None else stream:
            yield delta

    try:
        async for delta in deltas():
            event = {"model_name": backend.model_name, "text_output": delta}
            yield f"data: {json.dumps(event)}\n\n"
    except Exception as e:  # noqa: BLE001 - the stream has started: report, don't drop it
        message = e.message if isinstance(e, RequestError) else f"generation failed: {e}"
        yield f"data: {json.dumps(kserve_error(message))}\n\n"
