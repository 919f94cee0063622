"""Structured output: a grammar that every token of a sequence must follow, applied as a token mask
inside the batched sampler.

A `Grammar` (JSON schema, any JSON object, regex, a choice of strings, or a Lark grammar) travels
on `SamplingParams.grammar`. The engine compiles it once per sequence into a `GrammarMatcher`
(llguidance's `LLMatcher`: an Earley parser over a lazy lexer, so a schema compiles in well under
a millisecond where xgrammar and outlines-core take 70-200 ms on a 49k vocabulary; see
docs/benchmarks.md). Before each sampling step every constrained row's allowed tokens are written
into a bitmask and the others set to -inf, so greedy and sampled rows alike pick only tokens that
keep the text a prefix of the language; end-of-text is allowed only where the text is complete.
A sequence whose grammar admits no further token ends there (`finish_reason` "stop"); one that
runs out of `max_tokens` first ends with "length", never with an incomplete text called complete.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Literal

import llguidance
import torch
from pydantic import BaseModel, ConfigDict, Field

from kiln.platform.errors import InputError

GrammarKind = Literal["json_schema", "regex", "choice", "lark"]
# compact JSON with the separators json.dumps and OpenAI's examples use; no free whitespace, so
# a model cannot spend its max_tokens on blanks between the tokens that matter
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


class Grammar(BaseModel):
    """What a completion must match. `source` is a JSON schema (as JSON text), a regex, a JSON
    list of strings (choice) or a Lark grammar (llguidance's dialect, with `%json {...}`);
    `field` names the request field it came from, for error messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: GrammarKind = Field(description="What `source` holds: json_schema, regex, choice, lark.")
    source: str = Field(
        description="A JSON schema (as JSON text), a regex, a JSON list of strings, or a Lark "
        "grammar (llguidance's dialect)."
    )
    field: str = Field("grammar", description="The config or request field named in errors.")

    @classmethod
    def json_schema(cls, schema: dict[str, Any], field: str = "response_format") -> Grammar:
        return cls(kind="json_schema", source=json.dumps(schema), field=field)

    @classmethod
    def choice(cls, options: list[str], field: str = "guided_choice") -> Grammar:
        return cls(kind="choice", source=json.dumps(options), field=field)

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own serialized form."""
        matcher = llguidance.LLMatcher
        if self.kind == "json_schema":
            return matcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.source)
        if self.kind == "choice":
            options = json.loads(self.source)
            return matcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, options)))
        return matcher.grammar_from_lark(self.source)


class GrammarCompiler:
    """Grammars over one tokenizer: llguidance's view of the vocabulary (built once, ~0.5 s for
    a 49k-token vocabulary) and a matcher per sequence. `vocab_size` is the model's logits
    width, which may exceed the tokenizer's; the extra ids are never allowed."""

    def __init__(self, tokenizer, eos_token_ids: Collection[int], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer.to_str(),
            n_vocab=max(vocab_size, tokenizer.get_vocab_size()),
            eos_token=sorted(eos_token_ids) or None,  # None: the tokenizer's own
        )

    def check(self, grammar: Grammar) -> None:
        """Raise InputError (`<field>: <why>`) for a grammar llguidance cannot build: a bad
        regex, an unsupported JSON-schema keyword, a Lark syntax error."""
        try:
            compiled = grammar.llguidance_grammar()
        except ValueError as e:
            raise InputError(f"{grammar.field}: {e}") from None
        error = llguidance.LLMatcher.validate_grammar(compiled, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise InputError(f"{grammar.field}: {_one_line(error)}")

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        self.check(grammar)
        m = llguidance.LLMatcher(self.tokenizer, grammar.llguidance_grammar(), log_level=0)
        if m.is_error():
            raise InputError(f"{grammar.field}: {m.get_error()}")
        return GrammarMatcher(m, grammar.field)


def _one_line(error: str, limit: int = 300) -> str:
    """llguidance's multi-line report (message, source excerpt, caret) as one line."""
    lines = [ln.strip() for ln in error.splitlines()]
    text = " ".join(ln for ln in lines if ln and ln != "^" and "|" not in ln[:6])
    return text if len(text) <= limit else text[: limit - 3] + "..."


class GrammarMatcher:
    """One sequence's place in its grammar."""

    def __init__(self, matcher, field: str) -> None:
        self._m = matcher
        self.field = field

    def fill_mask(self, words: torch.Tensor) -> None:
        """Write the allowed next tokens into `words` (int32, one bit per token, contiguous).
        A grammar with no sentence at all (`start: start`, an empty character class) leaves the
        matcher in error with end-of-text as the only "allowed" token: that fails the request
        instead of ending it as if complete."""
        self._m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        if self._m.is_error():
            raise InputError(f"{self.field}: no text can satisfy this grammar")

    def advance(self, token: int) -> None:
        """Take one sampled token. The mask allows only tokens the grammar takes, so this fails
        only for a grammar that allows no token at all here (an empty language)."""
        if not self._m.consume_token(token):
            raise InputError(f"{self.field}: no text can satisfy this grammar")

    @property
    def complete(self) -> bool:
        """The text is a whole sentence of the grammar and nothing may follow it."""
        return self._m.is_stopped() and not self._m.is_error()


_BITS = torch.arange(32, dtype=torch.int32)


def apply_grammar_masks(logits: torch.Tensor, matchers: list[GrammarMatcher | None]) -> None:
    """Set to -inf, in place, every token of row i of `logits` [B, V] that matchers[i] forbids
    (rows without a matcher are left alone)."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    vocab = logits.shape[-1]
    words = torch.zeros(len(rows), (vocab + 31) // 32, dtype=torch.int32)
    for k, i in enumerate(rows):
        matchers[i].fill_mask(words[k])  # type: ignore[union-attr]
    allowed = ((words.unsqueeze(-1) >> _BITS) & 1).reshape(len(rows), -1)[:, :vocab].bool()
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))
