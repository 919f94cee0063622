"""A request's structured-output fields -> the engine's `Grammar`.

OpenAI's `response_format` (`json_object`: any JSON object; `json_schema`: JSON valid under the
schema) and vLLM's extensions, in both its spellings: `guided_json` / `guided_regex` /
`guided_choice` / `guided_grammar` (a Lark grammar in llguidance's dialect) and
`structured_outputs: {json | regex | choice | grammar}`. A request names at most one; the
schema is enforced as written (`strict` is accepted: the mask makes every completion follow the
schema either way). Whether the backend can build the grammar is its `prepare`'s to say (a 400
naming the field).
"""

from __future__ import annotations

import json
from typing import Any

from kiln.engine.grammar import ANY_JSON_OBJECT, Grammar
from kiln.serving.api.openai.protocol import OpenAIRequest
from kiln.serving.api.protocol import RequestError


def requested_grammar(req: OpenAIRequest) -> Grammar | None:
    """The one grammar `req` asks for, or None for free text."""
    found = [g for g in _candidates(req) if g is not None]
    if len(found) > 1:
        fields = ", ".join(g.field for g in found)
        raise RequestError(f"{fields}: give at most one structured-output constraint", param=fields)
    return found[0] if found else None


def _candidates(req: OpenAIRequest) -> list[Grammar | None]:
    out = [_response_format(req)]
    out.append(_json(req.guided_json, "guided_json"))
    if req.guided_regex is not None:
        out.append(Grammar(kind="regex", source=req.guided_regex, field="guided_regex"))
    if req.guided_choice is not None:
        out.append(Grammar.choice(req.guided_choice, "guided_choice"))
    if req.guided_grammar is not None:
        out.append(Grammar(kind="lark", source=req.guided_grammar, field="guided_grammar"))
    so = req.structured_outputs
    if so is not None:
        out.append(_json(so.json_, "structured_outputs.json"))
        if so.regex is not None:
            out.append(Grammar(kind="regex", source=so.regex, field="structured_outputs.regex"))
        if so.choice is not None:
            out.append(Grammar.choice(so.choice, "structured_outputs.choice"))
        if so.grammar is not None:
            out.append(Grammar(kind="lark", source=so.grammar, field="structured_outputs.grammar"))
    return out


def _response_format(req: OpenAIRequest) -> Grammar | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Grammar.json_schema(ANY_JSON_OBJECT, "response_format")
    if fmt.json_schema is None:
        raise RequestError(
            "response_format.json_schema: required when type is 'json_schema'",
            param="response_format.json_schema",
        )
    return Grammar.json_schema(fmt.json_schema.schema_, "response_format.json_schema.schema")


def _json(value: dict[str, Any] | str | None, field: str) -> Grammar | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise RequestError(f"{field}: not JSON ({e})", param=field) from None
        if not isinstance(value, dict):
            raise RequestError(f"{field}: a JSON schema is an object", param=field)
    return Grammar.json_schema(value, field)
