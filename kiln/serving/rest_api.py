"""The FastAPI routes: OpenAI completions, KServe v2 and Triton generate over one `Backend`.

Independent of Ray: `app.py` mounts this in a Ray Serve deployment; tests and benchmarks can
also drive it in-process. Every client mistake becomes a 4xx JSON error in the format of the
protocol the path belongs to (OpenAI `{"error": {...}}` under /v1, KServe `{"error": "..."}`
under /v2), never a 5xx.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiln.serving.backends import Backend
from kiln.serving.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    GenerateRequest,
    Limits,
    ModelCard,
    ModelList,
    ModelMetadata,
    RequestError,
    Usage,
    kserve_error,
    openai_error,
)
from kiln.serving.rest_kserve import (
    INPUTS,
    OUTPUTS,
    SamplingFields,
    infer_response,
    infer_to_generation,
    parse_infer_body,
    parse_sampling,
)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error_response(
    request: Request, message: str, status: int, param: str | None = None
) -> JSONResponse:
    is_openai = "/v1/" in request.url.path
    body = openai_error(message, status, param) if is_openai else kserve_error(message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    # drop "body" and pydantic's union-member tags ("str", "list[str]") from the location
    tags = {"str", "int", "float", "bool", "none"}
    loc = [
        str(p)
        for p in err.get("loc", ())
        if p != "body" and str(p) not in tags and "[" not in str(p)
    ]
    if err.get("type") == "json_invalid":
        return (
            f"request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})",
            None,
        )
    field = ".".join(loc) or "body"
    return f"{field}: {err.get('msg', 'invalid')}", field


def sampling_params(
    limits: Limits,
    prompts: list[str],
    fields: SamplingFields,
    *,
    default_max_tokens: int = 16,
    default_temperature: float = 0.0,
    field: str = "max_tokens",
):
    """Check the limits and build `SamplingParams`; any bad value is a RequestError (400)."""
    from kiln.serving.sampling import SamplingParams

    max_tokens = fields.max_tokens if fields.max_tokens is not None else fields.max_new_tokens
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    limits.check(prompts, max_tokens, field)
    temperature = default_temperature if fields.temperature is None else float(fields.temperature)
    top_p = 1.0 if fields.top_p is None else float(fields.top_p)
    if not math.isfinite(temperature) or temperature < 0:
        raise RequestError(f"temperature must be >= 0 (got {temperature})", param="temperature")
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1] (got {top_p})", param="top_p")
    if fields.top_k is not None and fields.top_k < 0:
        raise RequestError(f"top_k must be >= 0 (got {fields.top_k})", param="top_k")
    stop = [fields.stop] if isinstance(fields.stop, str) else list(fields.stop or [])
    try:
        return SamplingParams(
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_k=fields.top_k or 0,
            top_p=top_p,
            stop=[s for s in stop if s],
            seed=fields.seed,
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise RequestError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def create_api(backend: Backend, limits: Limits, api_key: str | None = None) -> FastAPI:
    """The REST surface over `backend`. With `api_key`, every route but the health probes needs
    `Authorization: Bearer <api_key>`."""
    api = FastAPI(title="kiln", docs_url=None, redoc_url=None, openapi_url=None)
    name = backend.model_name

    def require_model(model: str | None) -> None:
        if model is not None and model != name:
            raise RequestError(
                f"model {model!r} not found; this server serves {name!r}", 404, "model"
            )

    @api.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError):
        return _error_response(request, exc.message, exc.status, exc.param)

    @api.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        message, field = _validation_message(exc)
        return _error_response(request, message, 400, field)

    @api.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        return _error_response(request, str(exc.detail), exc.status_code)

    # ------------------------------------------------------------------------ OpenAI

    v1 = APIRouter(prefix="/v1")

    @v1.get("/models")
    async def list_models() -> ModelList:
        return ModelList(data=[ModelCard(id=name)])

    @v1.post("/completions")
    async def completions(req: CompletionRequest):
        require_model(req.model)
        if req.n != 1:
            raise RequestError("only n=1 is supported", param="n")
        prompts = req.prompts()
        fields = SamplingFields(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stops(),
        )
        params = sampling_params(limits, prompts, fields, default_temperature=1.0)
        if req.stream:
            if len(prompts) != 1:
                raise RequestError("stream=true takes one prompt", param="prompt")
            return StreamingResponse(
                _openai_stream(backend, prompts[0], params, req.echo),
                media_type="text/event-stream",
                headers=SSE_HEADERS,
            )
        results = await backend.complete(prompts, params)
        choices = [
            CompletionChoice(
                text=(p + r.text) if req.echo else r.text, index=i, finish_reason=r.finish_reason
            )
            for i, (p, r) in enumerate(zip(prompts, results, strict=False))
        ]
        usage = None
        if all(r.prompt_tokens is not None and r.completion_tokens is not None for r in results):
            pt = sum(r.prompt_tokens for r in results)  # type: ignore[misc]
            ct = sum(r.completion_tokens for r in results)  # type: ignore[misc]
            usage = Usage(prompt_tokens=pt, completion_tokens=ct, total_tokens=pt + ct)
        return CompletionResponse(model=name, choices=choices, usage=usage)

    async def _openai_stream(
        backend: Backend, prompt: str, params, echo: bool
    ) -> AsyncIterator[str]:
        first = CompletionResponse(model=name, choices=[])
        def chunk(text, reason):
            return first.model_copy(
                    update={"choices": [CompletionChoice(text=text, index=0, finish_reason=reason)]}
                ).model_dump_json()
        if echo:
            yield f"data: {chunk(prompt, None)}\n\n"
        deltas = 0
        async for delta in backend.stream(prompt, params):
            deltas += 1
            yield f"data: {chunk(delta, None)}\n\n"
        # a stream reports text, not tokens: one delta per token unless bytes merged
        reason = "length" if deltas >= params.max_new_tokens else "stop"
        yield f"data: {chunk('', reason)}\n\n"
        yield "data: [DONE]\n\n"

    # ---------------------------------------------------------------------- KServe v2

    @api.get("/v2/health/live")
    async def live():
        return {"live": True}

    @api.get("/v2/health/ready")
    async def ready():
        ok = await backend.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    v2 = APIRouter(prefix="/v2")

    @v2.get("")
    async def server_metadata():
        return {"name": "kiln", "version": "1", "extensions": ["binary_tensor_data", "generate"]}

    @v2.get("/models/{model}")
    @v2.get("/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str | None = None) -> ModelMetadata:
        require_model(model)
        return ModelMetadata(name=name, inputs=INPUTS, outputs=OUTPUTS)

    @v2.get("/models/{model}/ready")
    @v2.get("/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str | None = None):
        require_model(model)
        ok = await backend.ready()
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @v2.get("/models/{model}/stats")
    async def model_stats(model: str):
        """Triton's statistics extension, abridged: prompts completed and batches run by this replica."""
        require_model(model)
        return {"model_stats": [{"name": name, "version": "1", **backend.stats()}]}

    @v2.post("/models/{model}/infer")
    @v2.post("/models/{model}/versions/{version}/infer")
    async def infer(model: str, request: Request, version: str | None = None):
        require_model(model)
        body = await request.body()
        req, values = parse_infer_body(body, request.headers.get("inference-header-content-length"))
        prompts, fields = infer_to_generation(req, values)
        params = sampling_params(limits, prompts, fields)
        results = await backend.complete(prompts, params)
        shape = next(t.shape for t in req.inputs if t.name == "text_input")
        content, headers = infer_response(name, req, [r.text for r in results], shape)
        return Response(content, headers=headers)

    def _generate_params(req: GenerateRequest):
        top = parse_sampling(req.model_dump(exclude={"text_input", "parameters", "stream"}), "body")
        fields = parse_sampling(req.parameters, "parameters").merged(top)
        return sampling_params(limits, [req.text_input], fields)

    @v2.post("/models/{model}/generate")
    async def generate(model: str, req: GenerateRequest):
        require_model(model)
        params = _generate_params(req)
        (result,) = await backend.complete([req.text_input], params)
        return {"model_name": name, "model_version": "1", "text_output": result.text}

    @v2.post("/models/{model}/generate_stream")
    async def generate_stream(model: str, req: GenerateRequest):
        require_model(model)
        params = _generate_params(req)

        async def events():
            async for delta in backend.stream(req.text_input, params):
                yield f"data: {json.dumps({'model_name': name, 'text_output': delta})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    api.include_router(v1)
    api.include_router(v2)
    if api_key is not None:
        api.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return api


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every route but the health probes. A middleware, not a
    dependency, so a request without the key gets 401 before its body is even parsed."""

    PUBLIC = ("/v2/health/live", "/v2/health/ready")

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"].endswith(self.PUBLIC):
            return await self.app(scope, receive, send)
        header = Headers(scope=scope).get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            message = "missing API key: send 'Authorization: Bearer <key>'"
        elif scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key
        ):
            message = "invalid API key"
        else:
            return await self.app(scope, receive, send)
        response = _error_response(Request(scope), message, 401)
        await response(scope, receive, send)
