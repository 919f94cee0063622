"""Checked request fields -> `SamplingParams` and backend jobs, for every protocol's router."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request

from kiln.engine.grammar import Grammar
from kiln.engine.sampler import SamplingParams
from kiln.serving.api.protocol import Limits, RequestError, SamplingFields
from kiln.serving.backends.backend import Backend, Job, Prompt

# Server-sent events: no caching, no proxy buffering (each chunk reaches the client at once).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def primed(deltas: AsyncIterator[str]) -> AsyncIterator[str]:
    """`deltas` with its first item already awaited, before a stream's headers are sent: a
    backend that fails before the first token (a Triton server down) fails the request with its
    own status (503 + Retry-After: a client may retry it) instead of inside a started stream."""
    it = aiter(deltas)
    try:
        first = [await anext(it)]
    except StopAsyncIteration:
        first = []

    async def resumed() -> AsyncIterator[str]:
        for delta in first:
            yield delta
        async for delta in it:
            yield delta

    return resumed()


def backend_of(request: Request) -> Backend:
    return request.app.state.backend


def limits_of(request: Request) -> Limits:
    return request.app.state.limits


def lora_paths(backend: Backend) -> dict[str, str]:
    """{name: folder} of the LoRA adapters the backend serves besides its model (none where it
    has no LoRA), in load order."""
    adapters = getattr(backend, "lora_adapters", None)
    return {a.name: a.path for a in adapters()} if callable(adapters) else {}


def require_model(request: Request, model: str | None, with_adapters: bool = False) -> str | None:
    """None for the base model; with `with_adapters` (the OpenAI routes), the LoRA adapter `model`
    names; 404 for any other name."""
    backend = backend_of(request)
    name = backend.model_name
    if model is None or model == name:
        return None
    adapters = list(lora_paths(backend)) if with_adapters else []
    if model in adapters:
        return model
    also = f" and LoRA adapters {adapters}" if adapters else ""
    raise RequestError(
        f"model {model!r} not found; this server serves {name!r}{also}", 404, "model"
    )


def sampling_params(
    limits: Limits,
    prompts: list,
    fields: SamplingFields,
    *,
    default_max_tokens: int = 16,
    default_temperature: float = 0.0,
    field: str = "max_tokens",
    minimum: int = 1,
    grammar: Grammar | None = None,
) -> SamplingParams:
    """Apply the route's defaults and the deployment's limits (fields are already range-checked)."""
    default = min(default_max_tokens, limits.max_new_tokens)
    max_tokens = default if fields.max_tokens is None else fields.max_tokens
    limits.check(prompts, max_tokens, field, minimum)
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=default_temperature if fields.temperature is None else fields.temperature,
        top_k=fields.top_k or 0,
        top_p=1.0 if fields.top_p is None else fields.top_p,
        stop=[s for s in fields.stops() if s],
        seed=fields.seed,
        presence_penalty=fields.presence_penalty or 0.0,
        frequency_penalty=fields.frequency_penalty or 0.0,
        repetition_penalty=1.0 if fields.repetition_penalty is None else fields.repetition_penalty,
        grammar=grammar,
    )


async def prepare_jobs(
    backend: Backend,
    prompts: list[Prompt],
    params: SamplingParams,
    *,
    copies: int = 1,
    truncate: int | None = None,
    fit_context: bool = False,
    cache_salt: str | None = None,
    lora: str | None = None,
) -> list[Job]:
    """`copies` jobs per prompt (n / best_of), prompt-major; a seeded request seeds copy j with
    seed + j so the copies differ yet repeat. `cache_salt` keeps their cached prefixes apart
    from other requests'; `lora` names the adapter they decode with."""
    jobs = []
    for prompt in prompts:
        first = await backend.prepare(prompt, params, truncate=truncate, fit_context=fit_context)
        for j in range(copies):
            p = first.params
            if j and p.seed is not None:
                p = p.model_copy(update={"seed": (p.seed + j) % 2**63})
            jobs.append(Job(first.prompt, p, first.prompt_ids, cache_salt=cache_salt, lora=lora))
    return jobs
