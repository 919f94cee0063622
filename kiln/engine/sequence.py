"""One prompt being completed: its tokens so far, and the rule that decides when it stops."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from kiln.engine.grammar import GrammarMatcher
from kiln.engine.sampler import SamplingParams


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    rng: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None  # set when a stop string cut the text
    finish_reason: str | None = None
    grammar: GrammarMatcher | None = None  # structured output: where the text stands in it

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StopRule:
    """When a sequence ends: an end-of-text token, a complete text under its grammar, a stop
    string in its text (`decode` gives the text of token ids), its `max_new_tokens`, or a full
    context."""

    eos_token_ids: Collection[int]
    max_seq_len: int
    decode: Callable[[list[int]], str]

    def push(self, seq: Sequence, token: int) -> None:
        """Record one new token and decide whether the sequence is finished."""
        if token in self.eos_token_ids:
            seq.finish_reason = "stop"
            return
        seq.token_ids.append(token)
        if seq.grammar is not None:
            seq.grammar.advance(token)
            if seq.grammar.complete:  # nothing may follow: done, even on its last allowed token
                seq.finish_reason = "stop"
                return
        if seq.params.stop:
            text = self.decode(seq.token_ids)
            cuts = [i for i in (text.find(s) for s in seq.params.stop if s) if i >= 0]
            if cuts:
                seq.text = text[: min(cuts)]
                seq.finish_reason = "stop"
                return
        if len(seq.token_ids) >= seq.params.max_new_tokens:
            seq.finish_reason = "length"
        elif len(seq.prompt_ids) + len(seq.token_ids) >= self.max_seq_len:
            seq.finish_reason = "length"  # the context is full
