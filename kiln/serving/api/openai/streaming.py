"""OpenAI's server-sent events: the stream's `data:` lines (an error event when generation fails
after the stream started, never a dropped connection, then `[DONE]`), its finish reason and its
usage chunk."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from kiln.serving.api.openai.protocol import Usage
from kiln.serving.api.params import SSE_HEADERS
from kiln.serving.api.protocol import RequestError, openai_error
from kiln.serving.backends.backend import Job


def sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(guarded(events), media_type="text/event-stream", headers=SSE_HEADERS)


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """`data: <event>` lines, an OpenAI error event if generation fails, then `[DONE]`."""
    try:
        async for event in events:
            yield f"data: {event}\n\n"
    except Exception as e:  # noqa: BLE001 - the stream has started: report, don't drop it
        status = e.status if isinstance(e, RequestError) else 500
        message = e.message if isinstance(e, RequestError) else f"generation failed: {e}"
        yield f"data: {json.dumps(openai_error(message, status))}\n\n"
    yield "data: [DONE]\n\n"


_SLOT = "kiln-text-slot-5f0c9e"  # stands for the text while a chunk's JSON is built once


def text_template(render: Callable[[str], str]) -> Callable[[str], str]:
    """`render` (a text -> one chunk's JSON) for every token's text of a stream, built once:
    the chunk is rendered around a placeholder and each text is JSON-encoded into its place,
    instead of a pydantic model copied and serialised per token. Same JSON value as `render`."""
    head, slot, tail = render(_SLOT).partition(json.dumps(_SLOT))
    if not slot or _SLOT in head + tail:  # the placeholder is not a lone string value
        return render
    return lambda text: head + json.dumps(text, ensure_ascii=False) + tail


def stream_finish(job: Job, deltas: int) -> str:
    """Why the stream ended, as the backend saw it; a backend that cannot say (Triton's
    decoupled stream) is judged by its deltas, one per token unless bytes merged."""
    if job.finish_reason is not None:
        return job.finish_reason
    return "length" if deltas >= job.params.max_new_tokens else "stop"


def stream_usage(base, job: Job, deltas: int) -> str:
    pt = len(job.prompt_ids or [])
    ct = job.completion_tokens if job.completion_tokens is not None else deltas
    usage = Usage(prompt_tokens=pt, completion_tokens=ct, total_tokens=pt + ct)
    return base.model_copy(update={"choices": [], "usage": usage}).model_dump_json()
