"""The REST app: one router per protocol (OpenAI in `openai/routes.py`, KServe v2
in `kserve/routes.py`, Triton generate in `triton_generate/routes.py`) over the `Backend` held in
`app.state`, plus the error handlers and the API key.

Independent of Ray: `app.py` mounts this in a Ray Serve deployment; tests and benchmarks can
also drive it in-process. Every client mistake becomes a 4xx JSON error in the format of the
protocol the path belongs to (OpenAI `{"error": {...}}` under /v1, KServe `{"error": "..."}`
under /v2); a server fault is a 500 in the same format, never a dropped connection; a backend
that is down for a moment (RequestError status 503) answers 503 with Retry-After.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiln.serving.api import metrics
from kiln.serving.api.kserve import routes as kserve_routes
from kiln.serving.api.lora_metrics import LoRAInfoCollector, lora_requests
from kiln.serving.api.metrics import (
    MeteredBackend,
    ServerMetrics,
    engine_queues,
    engine_stats,
)
from kiln.serving.api.openai import lora_routes
from kiln.serving.api.openai import routes as openai_routes
from kiln.serving.api.protocol import Limits, RequestError, kserve_error, openai_error
from kiln.serving.api.triton_generate import routes as triton_generate_routes
from kiln.serving.backends.backend import Backend

log = logging.getLogger("kiln")

# pydantic's union-member tags in an error location ("str", "list[...]", "function-after[...]")
_UNION_TAGS = {"str", "int", "float", "bool", "none"}
RETRY_AFTER_S = 1  # a 503's Retry-After: a restarting Triton is back within seconds


def create_api(backend: Backend, limits: Limits, api_key: str | None = None) -> FastAPI:
    """The REST surface over `backend`. With `api_key`, every route but the health probes and
    /metrics needs `Authorization: Bearer <api_key>`. The OpenAPI schema is at /openapi.json."""
    api = FastAPI(title="kiln", docs_url=None, redoc_url=None)
    api.state.metrics = ServerMetrics(
        backend.model_name, engine_queues(backend), engine_stats(backend)
    )
    if (adapters := lora_requests(backend)) is not None:
        api.state.metrics.registry.register(LoRAInfoCollector(adapters))
    api.state.backend = MeteredBackend(backend, api.state.metrics)
    api.state.limits = limits
    api.add_exception_handler(RequestError, _on_request_error)
    api.add_exception_handler(RequestValidationError, _on_validation_error)
    api.add_exception_handler(StarletteHTTPException, _on_http_error)
    api.add_exception_handler(Exception, _on_server_error)
    api.include_router(openai_routes.router)
    api.include_router(lora_routes.router)
    api.include_router(kserve_routes.router)
    api.include_router(triton_generate_routes.router)
    api.include_router(metrics.router)
    if api_key is not None:
        api.add_middleware(ApiKeyMiddleware, api_key=api_key)
    api.add_middleware(BodySizeMiddleware, max_bytes=limits.max_body_bytes)  # outermost
    return api


def error_response(
    request: Request, message: str, status: int, param: str | None = None
) -> JSONResponse:
    is_openai = "/v1/" in request.url.path
    body = openai_error(message, status, param) if is_openai else kserve_error(message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 503:  # the backend is down for a moment (a Triton restart): retry, don't fail
        headers = {"Retry-After": str(RETRY_AFTER_S)}
    return JSONResponse(body, status_code=status, headers=headers)


async def _on_request_error(request: Request, exc: RequestError):
    return error_response(request, exc.message, exc.status, exc.param)


async def _on_validation_error(request: Request, exc: RequestValidationError):
    message, field = validation_message(exc)
    return error_response(request, message, 400, field)


async def _on_http_error(request: Request, exc: StarletteHTTPException):
    return error_response(request, str(exc.detail), exc.status_code)


async def _on_server_error(request: Request, exc: Exception):
    log.exception("request %s failed", request.url.path)
    return error_response(request, f"internal error: {type(exc).__name__}: {exc}", 500)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """(message, field) for the first error, e.g. ("temperature: must be ...", "temperature")."""
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        reason = err.get("ctx", {}).get("error", "parse error")
        return f"request body is not valid JSON ({reason})", None
    loc = [
        str(p)
        for p in err.get("loc", ())
        if p != "body" and str(p) not in _UNION_TAGS and "[" not in str(p)
    ]
    field = ".".join(loc) or "body"
    if err.get("type") in ("extra_forbidden", "none_required"):
        return f"{field}: not supported by this server", field
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{field}: {msg}", field


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every route but the health probes and /metrics (as vLLM
    leaves them open). A middleware, not a dependency, so a request without the key gets 401
    before its body is even parsed."""

    PUBLIC = ("/v2/health/live", "/v2/health/ready", "/health", "/metrics")

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
        response = error_response(Request(scope), message, 401)
        await response(scope, receive, send)


class BodySizeMiddleware:
    """413 for a body over `max_bytes`: by its Content-Length before reading it, or (chunked,
    no length) as soon as the bytes received pass the bound; a body is never held past it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                return await self._reject(scope, receive, send)
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:  # chunked: read up to the bound, then hand the app the whole body
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._reject(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send) -> None:
        message = f"request body is larger than {self.max_bytes} bytes (limits.max_body_bytes)"
        await error_response(Request(scope), message, 413)(scope, receive, send)
