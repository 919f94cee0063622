"""Tool calls out of the model's text: the Hermes/Qwen format, `<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`, one block per call, as vLLM's `hermes` parser reads it.

A block whose body is a JSON object with a string `name` becomes a call (`arguments` re-encoded
as a JSON string, the id `call_<24 hex>`); anything else, an unclosed block among it, stays in
the message's content. `ToolCallStream` does the same on streamed text: content is passed on as
it arrives, except a tail that may be the start of `<tool_call>`; a call is sent whole, in one
`delta.tool_calls` entry, when its block closes.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from kiln.serving.api.openai.tools import CALL_CLOSE, CALL_OPEN

_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


def parse_call(body: str) -> ParsedCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], text)


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content left around the calls, or None when only whitespace; the calls in order)."""
    calls: list[ParsedCall] = []
    kept: list[str] = []
    last = 0
    for block in _BLOCK.finditer(text):
        call = parse_call(block.group(1))
        if call is None:
            continue
        kept.append(text[last : block.start()])
        last = block.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


class ToolCallStream:
    """Streamed text in, (content piece | call) out, in order."""

    def __init__(self) -> None:
        self._buffer = ""
        self._blank = ""  # whitespace held until more content follows (dropped before a call)
        self.calls = 0

    def feed(self, text: str) -> list[str | ParsedCall]:
        self._buffer += text
        out: list[str | ParsedCall] = []
        while self._buffer:
            start = self._buffer.find(CALL_OPEN)
            if start < 0:
                keep = _partial_open(self._buffer)
                self._content(self._buffer[: len(self._buffer) - keep], out)
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            end = self._buffer.find(CALL_CLOSE, start)
            if end < 0:
                self._content(self._buffer[:start], out)
                self._buffer = self._buffer[start:]
                break
            call = parse_call(self._buffer[start + len(CALL_OPEN) : end])
            block_end = end + len(CALL_CLOSE)
            if call is None:
                self._content(self._buffer[:block_end], out)
            else:
                self._content(self._buffer[:start], out)
                self._blank = ""
                out.append(call)
                self.calls += 1
            self._buffer = self._buffer[block_end:]
        return out

    def finish(self) -> list[str | ParsedCall]:
        """What is left: an unfinished block or a tail, as content (trailing blanks dropped
        when calls were made, as the non-streamed message strips them)."""
        out: list[str | ParsedCall] = []
        rest, self._buffer = self._buffer, ""
        self._content(rest, out)
        if self._blank and not self.calls:
            out.append(self._blank)
        return out

    def _content(self, text: str, out: list[str | ParsedCall]) -> None:
        if not text:
            return
        if not text.strip():
            self._blank += text
            return
        out.append(self._blank + text)
        self._blank = ""


def _partial_open(text: str) -> int:
    """Length of the longest tail of `text` that begins `<tool_call>`."""
    for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_OPEN[:k]):
            return k
    return 0
