"""Writes openai_schemas.json: the response schemas of OpenAI's published OpenAPI spec
(github.com/openai/openai-openapi, MIT licence) that Kiln's endpoint answers with, and every
schema they reference, as one JSON Schema (2020-12) document with the schemas under `$defs`.

    python tests/serving/rest/vendor_openai_schemas.py path/to/openai-openapi/openapi.json

The test (test_openai_schema.py) validates against the vendored copy: no network at test time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOTS = [
    "CreateCompletionResponse",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
]
PREFIX = "#/components/schemas/"


def _refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"][len(PREFIX) :]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _nullable(node: dict) -> dict:
    """OpenAPI 3.0's `nullable: true`, which the spec still uses in places, as JSON Schema says
    it (a validator ignores the unknown keyword and would refuse the null the spec allows)."""
    node = {k: v for k, v in node.items() if k != "nullable"}
    if "enum" in node:
        node["enum"] = [*node["enum"], None]
    if isinstance(node.get("type"), str):
        return {**node, "type": [node["type"], "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def _rewrite(node):
    if isinstance(node, dict):
        node = _nullable(node) if node.get("nullable") is True else node
        return {
            k: ("#/$defs/" + v[len(PREFIX) :] if k == "$ref" else _rewrite(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v) for v in node]
    return node


def vendor(spec: dict) -> dict:
    schemas = spec["components"]["schemas"]
    todo, kept = list(ROOTS), {}
    while todo:
        name = todo.pop()
        if name not in kept:
            kept[name] = schemas[name]
            todo.extend(_refs(schemas[name]))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": "From github.com/openai/openai-openapi openapi.json (MIT licence), "
        f"info.version {spec['info']['version']}; regenerate with {Path(__file__).name}.",
        "$defs": {name: _rewrite(kept[name]) for name in sorted(kept)},
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("openai_schemas.json")
    out.write_text(json.dumps(vendor(json.loads(Path(sys.argv[1]).read_text())), indent=1) + "\n")
    print(f"wrote {out}")
