"""Structured output in the engine: the grammar mask inside the batched sampler makes a tiny
random model, which never writes JSON on its own, produce JSON valid under each of 20 schemas,
greedy and sampled, in one batch; a grammar that cannot finish within max_tokens ends with
`length` and an incomplete text; regex, choice and Lark grammars hold too."""

from __future__ import annotations

import json
import re

import pytest
import torch
from jsonschema import Draft202012Validator

from kiln.engine.engine import Engine
from kiln.engine.grammar import Grammar, GrammarCompiler
from kiln.engine.sampler import SamplingParams
from kiln.platform.errors import InputError
from tests.engine.tiny import tiny_generator, train_tokenizer

WORD = {"type": "string", "minLength": 1, "maxLength": 8}
SMALL = {"type": "integer", "minimum": -20, "maximum": 20}


def obj(properties: dict, required: list[str] | None = None, **extra) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


SCHEMAS = [
    obj({"name": WORD}),
    obj({"age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"score": {"type": "number", "minimum": 0, "maximum": 1}}),
    obj({"t": {"type": "number", "exclusiveMinimum": -5, "exclusiveMaximum": 5}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"ok": {"type": "boolean"}, "nothing": {"type": "null"}}),
    obj({"kind": {"const": "point"}, "x": SMALL, "y": SMALL}),
    obj({"tags": {"type": "array", "items": WORD, "maxItems": 3}}),
    obj({"ids": {"type": "array", "items": SMALL, "minItems": 2, "maxItems": 4}}),
    obj({"user": obj({"id": SMALL, "name": WORD})}),
    obj({"a": obj({"b": obj({"c": {"enum": [1, 2, 3]}})})}),
    obj({"items": {"type": "array", "items": obj({"k": WORD, "v": SMALL}), "maxItems": 2}}),
    obj({"name": WORD, "nick": WORD}, required=["name"]),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}),
    obj({"v": {"anyOf": [SMALL, {"type": "boolean"}]}}),
    obj(
        {
            "level": {"enum": ["low", "mid", "high"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
        }
    ),
    obj(
        {
            "matrix": {
                "type": "array",
                "items": {"type": "array", "items": SMALL, "maxItems": 2},
                "maxItems": 2,
            }
        }
    ),
    obj(
        {
            "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "ok": {"type": "boolean"},
        }
    ),
    obj(
        {
            "price": {"type": "number", "minimum": 0.5, "maximum": 99.5},
            "currency": {"enum": ["EUR", "USD"]},
        }
    ),
    obj(
        {
            "event": obj(
                {"name": WORD, "at": obj({"h": {"type": "integer", "minimum": 0, "maximum": 23}})}
            ),
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        }
    ),
]


@pytest.fixture(scope="module")
def gen():
    return tiny_generator("llama", train_tokenizer())


@pytest.fixture(autouse=True)
def one_torch_thread():
    """A dim-32 model gains nothing from a second thread, and on a loaded 2-core machine the
    threads' barriers cost 30x (measured: 15 s against 0.5 s for the 20-schema batch)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_completion_under_20_schemas_parses_and_validates(gen):
    # one batch: even schemas greedy, odd ones sampled (seeded)
    params = [
        SamplingParams(
            max_new_tokens=200, temperature=k % 2, seed=k, grammar=Grammar.json_schema(schema)
        )
        for k, schema in enumerate(SCHEMAS)
    ]
    completions = gen.generate(["the quick brown fox", "hello world"] * 10, params)
    for k, c in enumerate(completions):
        schema = SCHEMAS[k]
        assert c.finish_reason == "stop", (k, c.text)
        value = json.loads(c.text)
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(value)]
        assert not errors, (k, c.text, errors)


def test_a_grammar_that_cannot_finish_within_max_tokens_ends_with_length(gen):
    grammar = Grammar.json_schema(obj({"name": WORD, "tags": SCHEMAS[7]["properties"]["tags"]}))
    [c] = gen.generate(["the quick"], SamplingParams(max_new_tokens=4, grammar=grammar))
    assert c.finish_reason == "length"
    assert c.completion_tokens == 4
    with pytest.raises(ValueError):
        json.loads(c.text)  # an incomplete text, and said to be one


def test_regex_choice_and_lark_grammars_hold(gen):
    regex = Grammar(kind="regex", source=r"[a-c]{2}-[0-9]{3}")
    choice = Grammar.choice(["yes", "no", "maybe so"])
    lark = Grammar(kind="lark", source='start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/')
    params = [
        SamplingParams(max_new_tokens=40, temperature=1.0, seed=s, grammar=g)
        for g in (regex, choice, lark)
        for s in range(3)
    ]
    out = gen.generate(["hello"] * len(params), params)
    for c in out[:3]:
        assert re.fullmatch(r"[a-c]{2}-[0-9]{3}", c.text) and c.finish_reason == "stop", c
    for c in out[3:6]:
        assert c.text in ("yes", "no", "maybe so") and c.finish_reason == "stop", c
    for c in out[6:]:
        assert re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", c.text), c


def test_a_grammar_the_engine_cannot_build_names_its_field(gen):
    compiler = GrammarCompiler(gen.tokenizer, gen.eos_token_ids, 320)
    with pytest.raises(InputError, match="^guided_regex: .*unclosed"):
        compiler.check(Grammar(kind="regex", source="[a-z", field="guided_regex"))
    bad = Grammar.json_schema({"type": "string", "format": "no-such-format"}, "response_format")
    with pytest.raises(InputError, match="^response_format: .*no-such-format"):
        compiler.check(bad)


def test_a_grammar_with_no_sentence_fails_its_own_request_only(gen):
    """Three rows in one batch: a grammar with no sentence (its request fails), a choice (it
    holds) and a free greedy row (the same text as alone: the mask touched only its own row)."""
    empty = Grammar(kind="lark", source="start: start", field="guided_grammar")
    params = [
        SamplingParams(max_new_tokens=8, grammar=empty),
        SamplingParams(max_new_tokens=8, grammar=Grammar.choice(["yes", "no"])),
        SamplingParams(max_new_tokens=8),
    ]
    engine = Engine(gen, max_slots=4)
    heard: list[list] = [[], [], []]
    prompt = gen.encode("hello")
    requests = [engine.submit(prompt, p, heard[k].append) for k, p in enumerate(params)]
    for _ in engine.run(requests):
        pass
    assert heard[0][-1].kind == "error"
    assert str(heard[0][-1].error).startswith("guided_grammar: ")
    assert heard[1][-1].kind == "finish" and gen.decode(heard[1][-1].token_ids) in ("yes", "no")
    [alone] = gen.generate(["hello"], SamplingParams(max_new_tokens=8))
    assert heard[2][-1].token_ids == alone.token_ids
