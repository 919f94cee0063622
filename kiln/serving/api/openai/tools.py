"""OpenAI `tools` / `tool_choice` on the way in: what the chat template sees, and the grammar that
forces a call.

Tools reach the model through its own chat template, as transformers' `apply_chat_template(
tools=...)` passes them (the `tools` variable: a list of `{"type": "function", "function": ...}`);
assistant turns that called tools carry `tool_calls` with `arguments` as an object, and a tool's
answer is a `tool` message. A template that never reads `tools` (kiln's ChatML, many base models)
gets the Hermes/Qwen2.5 tool prompt in its system message instead, and earlier calls and answers
written as `<tool_call>` / `<tool_response>` text, so the model is told the same format the
parser reads back (tool_parser.py).

`tool_choice`: `none` shows no tools and parses nothing; `auto` (the default with tools) lets the
model choose and parses what it writes; `required` and a named function force it with a grammar:
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the arguments under the tool's
`parameters` schema, one call or (with `parallel_tool_calls`) several on their own lines.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.engine.grammar import JSON_OPTIONS, Grammar
from kiln.serving.api.openai.protocol import ChatCompletionRequest, ChatMessage, Tool
from kiln.serving.api.protocol import RequestError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def active_tools(req: ChatCompletionRequest) -> list[Tool]:
    """The tools the model may call in this request (none under `tool_choice: none`)."""
    if req.tool_choice is not None and not req.tools:
        raise RequestError("tool_choice needs tools", param="tool_choice")
    if not req.tools or req.tool_choice == "none":
        return []
    names = [t.function.name for t in req.tools]
    if len(set(names)) != len(names):
        raise RequestError("tools: function names must be unique", param="tools")
    return list(req.tools)


def forced_tools(req: ChatCompletionRequest, tools: list[Tool]) -> list[Tool]:
    """The tools a grammar must hold the model to: all (`required`), one (named), or none."""
    choice = req.tool_choice
    if choice == "required":
        return tools
    if choice is None or isinstance(choice, str):
        return []
    named = [t for t in tools if t.function.name == choice.function.name]
    if not named:
        raise RequestError(
            f"tool_choice.function.name: no tool named {choice.function.name!r} in tools",
            param="tool_choice.function.name",
        )
    return named


def tool_call_grammar(tools: list[Tool], parallel: bool) -> Grammar:
    """A Lark grammar (llguidance's, with inline JSON schemas) for one call, or several."""
    calls = [_call_schema(t) for t in tools]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, "x-guidance": JSON_OPTIONS}  # compact JSON, as response_format's
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    call = f"call: {json.dumps(CALL_OPEN + chr(10))} %json {json.dumps(schema)} "
    call += json.dumps("\n" + CALL_CLOSE)
    return Grammar(kind="lark", source=f"{start}\n{call}\n", field="tools")


def _call_schema(tool: Tool) -> dict[str, Any]:
    f = tool.function
    return {
        "type": "object",
        "properties": {"name": {"const": f.name}, "arguments": f.parameters or NO_ARGUMENTS},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def template_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in tools]


def template_messages(
    messages: list[ChatMessage], tools: list[Tool], template_reads_tools: bool
) -> list[dict[str, Any]]:
    """Messages as chat templates take them. Without a template that reads `tools`, the tool
    prompt joins the system message, and calls and tool answers become Hermes-format text."""
    out: list[dict[str, Any]] = []
    for m in messages:
        entry: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            calls = [
                {
                    "type": "function",
                    "id": c.id,
                    "function": {"name": c.function.name, "arguments": _args(c.function.arguments)},
                }
                for c in m.tool_calls
            ]
            if template_reads_tools:
                entry["tool_calls"] = calls
            else:
                entry["content"] = "\n".join([entry["content"], *map(_call_text, calls)]).strip()
        if m.role == "tool":
            if template_reads_tools:
                entry["tool_call_id"] = m.tool_call_id
            else:
                answer = f"<tool_response>\n{m.text()}\n</tool_response>"
                entry = {"role": "user", "content": answer}
        out.append(entry)
    if tools and not template_reads_tools:
        prompt = HERMES_TOOLS_PROMPT.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in template_tools(tools))
        )
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _args(arguments: str) -> Any:
    """A call's arguments as templates expect them (an object), or the text if it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _call_text(call: dict[str, Any]) -> str:
    body = {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
    return f"{CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{CALL_CLOSE}"
