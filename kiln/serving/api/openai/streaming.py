"""OpenAI's server-sent events: the stream's `data:` lines (an error event when generation fails
after the stream started, never a dropped connection, then `[DONE]`), its finish reason and its
usage chunk."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

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
