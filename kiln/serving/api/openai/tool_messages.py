"""Tool calls in chat answers: the calls parsed out of a finished answer, and a stream's calls
as `delta.tool_calls`, each call whole in one delta."""

from __future__ import annotations

from kiln.serving.api.openai.protocol import (
    AssistantMessage,
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
)
from kiln.serving.api.openai.tool_parser import ParsedCall, ToolCallStream, parse_tool_calls


def tool_message(text: str, reason: str, parallel: bool) -> tuple[AssistantMessage, str]:
    """The message with the calls parsed out of `text`; finish reason `tool_calls` when the
    model stopped after calling (a call cut short by max_tokens stays text, and `length`)."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return AssistantMessage(content=text), reason
    if not parallel:
        calls = calls[:1]
    tool_calls = [_tool_call(c) for c in calls]
    return AssistantMessage(content=content, tool_calls=tool_calls), calls_finish(reason)


def _tool_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


def calls_finish(reason: str) -> str:
    return "tool_calls" if reason == "stop" else reason


class ToolCallDeltas:
    """A stream's text deltas as chat deltas, its `<tool_call>` blocks as whole calls (only the
    first when parallel calls are off, as the non-streamed answer keeps the first)."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel
        self.calls = ToolCallStream()
        self.sent = 0  # calls sent: the index of the next one

    def feed(self, text: str) -> list[ChatDelta]:
        return self._deltas(self.calls.feed(text))

    def finish(self) -> list[ChatDelta]:
        return self._deltas(self.calls.finish())

    def _deltas(self, items: list[str | ParsedCall]) -> list[ChatDelta]:
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(ChatDelta(content=item))
                continue
            if self.sent and not self.parallel:
                continue
            function = FunctionCallDelta(name=item.name, arguments=item.arguments)
            call = ToolCallDelta(index=self.sent, id=item.id, type="function", function=function)
            out.append(ChatDelta(tool_calls=[call]))
            self.sent += 1
        return out
