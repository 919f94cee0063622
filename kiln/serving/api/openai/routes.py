"""The OpenAI router: `/v1/models`, `/v1/completions`, `/v1/chat/completions` over the backend
in `request.app.state`. Streams are server-sent events (streaming.py); a failure before the first
token is a plain error answer (a down Triton server: 503 + Retry-After). Tool calls are parsed
out of chat answers by tool_messages.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from kiln.serving.api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAIRequest,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from kiln.serving.api.openai.streaming import sse, stream_finish, stream_usage, text_template
from kiln.serving.api.openai.structured import requested_grammar
from kiln.serving.api.openai.tool_messages import ToolCallDeltas, calls_finish, tool_message
from kiln.serving.api.openai.tools import (
    active_tools,
    forced_tools,
    template_messages,
    template_tools,
    tool_call_grammar,
)
from kiln.serving.api.params import (
    backend_of,
    limits_of,
    lora_paths,
    prepare_jobs,
    primed,
    require_model,
    sampling_params,
)
from kiln.serving.api.protocol import RequestError
from kiln.serving.backends.backend import Backend, Job, Result
from kiln.serving.chat_template import render_chat
from kiln.text.chat_template import end_of_turn_markers, reads_tools

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(request: Request) -> ModelList:
    backend = backend_of(request)
    return ModelList(data=[_card(backend), *(_card(backend, a) for a in lora_paths(backend))])


@router.get("/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> ModelCard:
    return _card(backend_of(request), require_model(request, model_id, with_adapters=True))


def _card(backend: Backend, lora: str | None = None) -> ModelCard:
    """The base model's card, or a LoRA adapter's: `root` its folder, `parent` the base (as
    vLLM lists them)."""
    return ModelCard(
        id=lora or backend.model_name,
        max_model_len=backend.context_length,
        has_chat_template=bool(backend.chat_template),
        root=lora_paths(backend).get(lora, lora) if lora else backend.model_name,
        parent=backend.model_name if lora else None,
    )


def _served(backend: Backend, job: Job) -> str:
    """The `model` an answer names: the adapter the job decoded with, else the base."""
    return job.lora or backend.model_name


def _check_common(request: Request, req: OpenAIRequest) -> str | None:
    """Checks every route shares; returns the LoRA adapter `model` names (None: the base)."""
    lora = require_model(request, req.model, with_adapters=True)
    if req.logit_bias:
        raise RequestError("logit_bias is not supported", param="logit_bias")
    if req.stream and req.n != 1:
        raise RequestError("stream=true takes n=1", param="n")
    return lora


def _usage(results: list[Result], prompts: int) -> Usage | None:
    if any(r.prompt_tokens is None or r.completion_tokens is None for r in results):
        return None
    per_prompt = len(results) // max(prompts, 1)
    pt = sum(r.prompt_tokens for r in results[::per_prompt])  # type: ignore[misc]
    ct = sum(r.completion_tokens for r in results)  # type: ignore[misc]
    return Usage(prompt_tokens=pt, completion_tokens=ct, total_tokens=pt + ct)


# ------------------------------------------------------------------------- completions


@router.post("/completions")
async def completions(req: CompletionRequest, request: Request):
    backend, limits = backend_of(request), limits_of(request)
    lora = _check_common(request, req)
    best_of = req.best_of or req.n
    if best_of < req.n:
        raise RequestError(f"best_of ({best_of}) must be >= n ({req.n})", param="best_of")
    prompts = req.prompts()
    if len(prompts) * best_of > limits.max_prompts_per_request:
        raise RequestError(
            f"{len(prompts)} prompts x {best_of} completions; at most "
            f"{limits.max_prompts_per_request} in one request",
            param="n",
        )
    # max_tokens 0 scores the prompt (echo + logprobs) without generating, as OpenAI allowed
    minimum = 0 if req.echo and not req.stream else 1
    params = sampling_params(
        limits,
        prompts,
        req,
        default_temperature=1.0,
        minimum=minimum,
        grammar=requested_grammar(req),
    )
    if req.stream and (len(prompts) != 1 or best_of != 1 or req.logprobs is not None):
        raise RequestError("stream=true takes one prompt, n=1 and no logprobs", param="stream")
    jobs = await prepare_jobs(
        backend,
        prompts,
        params,
        copies=best_of,
        truncate=req.truncate_prompt_tokens,
        cache_salt=req.cache_salt,
        lora=lora,
    )
    if req.stream:
        deltas = await primed(backend.stream(jobs[0]))  # fails before headers: a plain error
        return sse(_completion_stream(backend, jobs[0], req, deltas))
    results = await backend.complete(jobs)
    want_scores = req.logprobs is not None or best_of > req.n
    top = req.logprobs or 0
    scores = [await _score(backend, r, top) if want_scores else None for r in results]
    choices: list[CompletionChoice] = []
    for p in range(len(prompts)):
        group = list(range(p * best_of, (p + 1) * best_of))
        if best_of > req.n:  # keep the n completions the model finds most likely
            group = sorted(group, key=lambda i: -_completion_logprob(results[i], scores[i]))
        for i in group[: req.n]:
            r, echo = results[i], _echo_text(backend, jobs[i]) if req.echo else ""
            lp = None
            if req.logprobs is not None:
                lp = _completion_logprobs(backend, r, scores[i], top, req.echo)
            choices.append(
                CompletionChoice(
                    text=echo + r.text,
                    index=len(choices),
                    logprobs=lp,
                    finish_reason=r.finish_reason,
                )
            )
    return CompletionResponse(
        model=_served(backend, jobs[0]), choices=choices, usage=_usage(results, len(prompts))
    )


async def _score(backend: Backend, r: Result, top: int):
    """Scores of prompt + completion, and of the end-of-text token that ended it (vLLM lists
    it too: lm-evaluation-harness reads token_logprobs[ctxlen:-1], one past the prompt)."""
    if r.prompt_ids is None or r.token_ids is None:
        raise RequestError("logprobs need token ids, which this backend does not return")
    ids = r.prompt_ids + r.token_ids
    if not (r.ended_by_eos and backend.eos_token_ids):
        return await backend.score(ids, top)
    candidates = [await backend.score(ids + [e], top) for e in sorted(backend.eos_token_ids)]
    return max(candidates, key=lambda s: s[-1].logprob)  # the one the model would have picked


def _completion_logprob(r: Result, scores) -> float:
    n = len(r.prompt_ids or [])
    return sum(s.logprob for s in scores[n:] if s.logprob is not None)


def _echo_text(backend: Backend, job: Job) -> str:
    if isinstance(job.prompt, str):
        return job.prompt
    return "".join(backend.token_texts(job.prompt))


def _completion_logprobs(backend: Backend, r: Result, scores, top: int, echo: bool):
    """The legacy logprobs object over the completion (and, with echo, the prompt first)."""
    start = 0 if echo else len(r.prompt_ids or [])
    picked = scores[start:]
    texts = backend.token_texts([s.token_id for s in picked])
    out = CompletionLogprobs()
    offset = 0
    for s, text in zip(picked, texts, strict=True):
        out.tokens.append(text)
        out.token_logprobs.append(s.logprob)
        if s.logprob is None:
            out.top_logprobs.append(None)
        else:
            alternatives = dict(
                zip(
                    backend.token_texts([t for t, _ in s.top]), [lp for _, lp in s.top], strict=True
                )
            )
            alternatives.setdefault(text, s.logprob)  # the chosen token is always listed
            out.top_logprobs.append(alternatives)
        out.text_offset.append(offset)
        offset += len(text)
    return out


async def _completion_stream(
    backend: Backend, job: Job, req: CompletionRequest, stream: AsyncIterator[str] | None = None
) -> AsyncIterator[str]:
    base = CompletionResponse(model=_served(backend, job), choices=[])

    def chunk(text: str, reason=None) -> str:
        choice = CompletionChoice(text=text, index=0, finish_reason=reason)
        # `usage` only on the usage chunk: the schema has an object there, or nothing
        return base.model_copy(update={"choices": [choice]}).model_dump_json(exclude={"usage"})

    text_chunk = text_template(chunk)  # the same JSON as chunk(text), for each token's text
    if req.echo:
        yield text_chunk(_echo_text(backend, job))
    deltas = 0
    async for delta in backend.stream(job) if stream is None else stream:
        deltas += 1
        yield text_chunk(delta)
    yield chunk("", stream_finish(job, deltas))
    if req.stream_options and req.stream_options.include_usage:
        yield stream_usage(base, job, deltas)


# ---------------------------------------------------------------------- chat completions


@router.post("/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    backend, limits = backend_of(request), limits_of(request)
    lora = _check_common(request, req)
    tools = active_tools(req)
    grammar = requested_grammar(req)
    forced = forced_tools(req, tools)
    if forced:
        if grammar is not None:
            raise RequestError(
                f"tool_choice {req.tool_choice!r} forces a tool call; {grammar.field} cannot "
                "constrain the same answer",
                param="tool_choice",
            )
        grammar = tool_call_grammar(forced, req.parallel_tool_calls)
    if req.top_logprobs and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    if req.stream and req.logprobs:
        raise RequestError("stream=true with logprobs is not supported", param="logprobs")
    if req.n > limits.max_prompts_per_request:
        raise RequestError(f"n must be at most {limits.max_prompts_per_request}", param="n")
    in_template = reads_tools(backend.chat_template)
    prompt = render_chat(
        template_messages(req.messages, tools, in_template),
        backend.chat_template,
        backend.special_tokens,
        req.add_generation_prompt,
        tools=template_tools(tools) if tools and in_template else None,
    )
    ends = end_of_turn_markers(backend.chat_template, backend.special_tokens)
    max_tokens = req.resolved_max_tokens()
    fields = req.model_copy(update={"max_tokens": max_tokens, "stop": req.stops() + ends})
    params = sampling_params(
        limits,
        [prompt],
        fields,
        default_max_tokens=limits.max_new_tokens,
        default_temperature=1.0,
        grammar=grammar,
    )
    jobs = await prepare_jobs(
        backend,
        [prompt],
        params,
        copies=req.n,
        truncate=req.truncate_prompt_tokens,
        cache_salt=req.cache_salt,
        fit_context=max_tokens is None,  # no limit asked: up to the end of the context
        lora=lora,
    )
    if req.stream:
        deltas = await primed(backend.stream(jobs[0]))  # fails before headers: a plain error
        return sse(_chat_stream(backend, jobs[0], req, deltas, bool(tools)))
    results = await backend.complete(jobs)
    choices = []
    for i, r in enumerate(results):
        lp = None
        if req.logprobs:
            scores = await _score(backend, r, req.top_logprobs or 0)
            lp = _chat_logprobs(backend, scores[len(r.prompt_ids or []) :])
        message, reason = AssistantMessage(content=r.text), r.finish_reason
        if tools:
            message, reason = tool_message(r.text, reason, req.parallel_tool_calls)
        choices.append(ChatChoice(index=i, message=message, logprobs=lp, finish_reason=reason))
    return ChatCompletionResponse(
        model=_served(backend, jobs[0]), choices=choices, usage=_usage(results, 1)
    )


def _chat_logprobs(backend: Backend, scores) -> ChoiceLogprobs:
    def entry(logprob: float, text: str, raw: bytes) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    content = []
    for s in scores:
        ids = [s.token_id] + [t for t, _ in s.top]
        texts, raw = backend.token_texts(ids), backend.token_bytes(ids)
        tops = [
            TopLogprob(**entry(lp, texts[k + 1], raw[k + 1])) for k, (_, lp) in enumerate(s.top)
        ]
        content.append(TokenLogprob(**entry(s.logprob or 0.0, texts[0], raw[0]), top_logprobs=tops))
    return ChoiceLogprobs(content=content)


async def _chat_stream(
    backend: Backend,
    job: Job,
    req: ChatCompletionRequest,
    stream: AsyncIterator[str] | None = None,
    with_tools: bool = False,
) -> AsyncIterator[str]:
    base = ChatCompletionChunk(model=_served(backend, job), choices=[])
    calls = ToolCallDeltas(req.parallel_tool_calls) if with_tools else None

    def chunk(delta: ChatDelta, reason=None) -> str:
        choice = ChatChunkChoice(index=0, delta=delta, finish_reason=reason)
        event = base.model_copy(update={"choices": [choice]}).model_dump(exclude={"usage"})
        # the delta carries only what changed; `finish_reason` is null until the last chunk
        event["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
        del event["choices"][0]["logprobs"]
        return json.dumps(event, ensure_ascii=False)

    yield chunk(ChatDelta(role="assistant", content=""))
    content_chunk = text_template(lambda text: chunk(ChatDelta(content=text)))
    deltas = 0
    async for delta in backend.stream(job) if stream is None else stream:
        deltas += 1
        if calls is None:
            yield content_chunk(delta)
            continue
        for piece in calls.feed(delta):
            yield chunk(piece)
    if calls is not None:
        for piece in calls.finish():
            yield chunk(piece)
    reason = stream_finish(job, deltas)
    if calls is not None and calls.sent:
        reason = calls_finish(reason)
    yield chunk(ChatDelta(), reason)
    if req.stream_options and req.stream_options.include_usage:
        yield stream_usage(base, job, deltas)
