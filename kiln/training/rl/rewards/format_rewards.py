"""Format rewards: `regex` (the completion matches a pattern), `json_schema` (it is JSON valid
under a schema) and `length_penalty` (it keeps to a length)."""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.platform.errors import ConfigError
from kiln.text.tokenizer import load_tokenizer
from kiln.training.rl.rewards.params import parse_params
from kiln.training.rl.rewards.types import Reward, RewardFailed

JSON_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


class RegexParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str
    match: Literal["search", "full"] = "search"  # anywhere in the completion, or all of it
    ignore_case: bool = False


def regex(params: dict, where: str) -> Reward:
    p = parse_params(RegexParams, params, where)
    flags = re.DOTALL | (re.IGNORECASE if p.ignore_case else 0)
    try:
        compiled = re.compile(p.pattern, flags)
    except re.error as e:
        raise ConfigError(f"{where}.pattern: not a valid regular expression ({e})") from None
    find = compiled.fullmatch if p.match == "full" else compiled.search

    def reward(prompt: str, completion: str, row: dict) -> float:
        return 1.0 if find(completion.strip() if p.match == "full" else completion) else 0.0

    return reward


class JsonSchemaParams(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: dict | None = Field(None, alias="schema")  # the JSON Schema, or...
    schema_field: str | None = None  # ...the row field holding one (a dict or its JSON text)

    @model_validator(mode="after")
    def _one_schema(self) -> JsonSchemaParams:
        if (self.schema_ is None) == (self.schema_field is None):
            raise ValueError("give exactly one of 'schema' or 'schema_field'")
        return self


def _json_text(completion: str) -> str:
    """The completion's ```json block if it has one, else the completion itself."""
    fenced = JSON_FENCE.findall(completion)
    return fenced[-1] if fenced else completion


def json_schema(params: dict, where: str) -> Reward:
    import jsonschema

    p = parse_params(JsonSchemaParams, params, where)
    fixed = None
    if p.schema_ is not None:
        try:
            fixed = jsonschema.validators.validator_for(p.schema_)(p.schema_)
            fixed.check_schema(p.schema_)
        except jsonschema.SchemaError as e:
            raise ConfigError(f"{where}.schema: not a valid JSON Schema ({e.message})") from None

    def reward(prompt: str, completion: str, row: dict) -> float:
        validator = fixed
        if validator is None:
            schema = row[p.schema_field]
            schema = json.loads(schema) if isinstance(schema, str) else schema
            validator = jsonschema.validators.validator_for(schema)(schema)
        try:
            value = json.loads(_json_text(completion))
        except json.JSONDecodeError as e:
            raise RewardFailed(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            at = "/".join(str(x) for x in error.absolute_path) or "(root)"
            raise RewardFailed(f"schema: {at}: {error.message}")
        return 1.0

    return reward


class LengthPenaltyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit: Literal["chars", "words", "tokens"] = "chars"
    tokenizer: str | None = None  # a tokenizer.json or its directory, for unit: tokens
    target: int | None = None  # penalise the distance to this length...
    max: int | None = None  # ...or only going over this one (DAPO's overlong penalty)
    buffer: int = 0  # with max: the penalty ramps from 0 at max - buffer to -1 at max

    @model_validator(mode="after")
    def _one_bound(self) -> LengthPenaltyParams:
        if (self.target is None) == (self.max is None):
            raise ValueError("give exactly one of 'target' or 'max'")
        if (self.target or 1) <= 0 or (self.max or 1) <= 0:
            raise ValueError("'target' and 'max' must be positive")
        if self.max is not None and not 0 <= self.buffer <= self.max:
            raise ValueError("'buffer' must be between 0 and 'max'")
        if self.unit == "tokens" and self.tokenizer is None:
            raise ValueError("unit 'tokens' needs 'tokenizer' (a tokenizer.json or directory)")
        return self


def length_penalty(params: dict, where: str) -> Reward:
    """0 within bounds, down to -1: -|L - target| / target, or DAPO's soft overlong penalty."""
    p = parse_params(LengthPenaltyParams, params, where)
    if p.unit == "tokens":
        tok = load_tokenizer(p.tokenizer)  # type: ignore[arg-type]

        def length(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False).ids)
    elif p.unit == "words":

        def length(text: str) -> int:
            return len(text.split())
    else:
        length = len

    def reward(prompt: str, completion: str, row: dict) -> float:
        n = length(completion)
        if p.target is not None:
            return -min(1.0, abs(n - p.target) / p.target)
        assert p.max is not None
        if n <= p.max - p.buffer:
            return 0.0
        if n >= p.max or p.buffer == 0:
            return -1.0
        return -(n - (p.max - p.buffer)) / p.buffer

    return reward
