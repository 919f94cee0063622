"""Sampling parameters and next-token selection: greedy, temperature, top-k, top-p, penalties,
seeded. Every row of a batch is sampled with its own parameters, in a numerically safe way: a row
whose distribution cannot be formed (non-finite logits) falls back to its argmax instead of
raising inside `torch.multinomial` and failing the whole batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from kiln.engine.grammar import Grammar, GrammarMatcher, apply_grammar_masks

TEMPERATURE_MIN = 1e-5  # 0 < temperature < this would overflow logits / temperature
SEED_MAX = 2**63 - 1


class SamplingParams(BaseModel):
    """How to pick tokens. temperature 0 is greedy; top_k 0 and top_p 1.0 turn those filters off."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(64, ge=0, description="Generate at most this many tokens.")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy (argmax).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0: all).")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Keep the smallest set with this much mass."
    )
    stop: list[str] = Field(default_factory=list, description="Stop before any of these strings.")
    seed: int | None = Field(
        None, ge=0, le=SEED_MAX, description="Seed for sampling (same seed, same text)."
    )
    presence_penalty: float = Field(0.0, description="OpenAI's: minus this once per seen token.")
    frequency_penalty: float = Field(0.0, description="OpenAI's: minus this per occurrence.")
    repetition_penalty: float = Field(
        1.0, gt=0.0, description="CTRL's (as transformers): >1 discourages seen tokens."
    )
    grammar: Grammar | None = Field(
        None, description="Structured output: every token must keep the text in this grammar."
    )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k and outside the top-p nucleus of one row [V]."""
    if top_k and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> torch.Tensor:
    """One row [V]: the repetition penalty over prompt and output (transformers'
    RepetitionPenaltyLogitsProcessor), then presence / frequency penalties over the output
    (OpenAI's and vLLM's definition)."""
    if params.repetition_penalty != 1.0 and (prompt_ids or output_ids):
        ids = torch.tensor([*prompt_ids, *output_ids], dtype=torch.long, device=logits.device)
        seen = logits.gather(0, ids)
        penalty = params.repetition_penalty
        logits = logits.scatter(0, ids, torch.where(seen < 0, seen * penalty, seen / penalty))
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        ids = torch.tensor(list(output_ids), dtype=torch.long, device=logits.device)
        counts = torch.zeros_like(logits).scatter_add(0, ids, torch.ones_like(logits[ids]))
        logits = logits - params.frequency_penalty * counts
        logits = logits - params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """A private RNG per sequence, so a seeded request gives the same text in any batch."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """The distribution [V] (float64) a sampled row draws from: temperature, top-k, top-p over
    one row [V] of logits; None where it cannot be formed (greedy, or non-finite logits), and
    the row then takes its argmax. Speculative decoding verifies drafts against this same
    distribution (kiln/engine/rejection_sampler.py)."""
    logits = torch.nan_to_num(logits.double(), nan=float("-inf"))
    if params.greedy or not torch.isfinite(logits).any():
        return None
    # shifting by the max first keeps logits / temperature finite for any temperature >= 1e-5
    finite_max = logits.masked_fill(~torch.isfinite(logits), float("-inf")).max()
    row = (logits - finite_max).clamp(min=-1e300) / max(params.temperature, TEMPERATURE_MIN)
    probs = torch.softmax(filter_logits(row, params.top_k, params.top_p), dim=-1)
    if not torch.isfinite(probs).all() or float(probs.sum()) <= 0:
        return None
    return probs


def sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """One token from one row [V] of float logits; argmax whenever sampling is ill-defined."""
    probs = sampling_probs(logits, params)
    if probs is None:
        return int(torch.nan_to_num(logits.double(), nan=float("-inf")).argmax())
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def sample_next(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    grammars: Sequence[GrammarMatcher | None] | None = None,
) -> torch.Tensor:
    """Pick one token per row of `logits` [B, V] with that row's parameters; returns [B] int64.
    `histories` ((prompt ids, output ids) per row) feed the penalties of rows that ask for them;
    `grammars` (a matcher or None per row) mask each constrained row to the tokens its grammar
    allows, before greedy and sampled rows alike pick."""
    logits = logits.float()
    if grammars is not None and any(g is not None for g in grammars):
        logits = logits.clone()  # masked here; the caller's logits stay the model's
        apply_grammar_masks(logits, list(grammars))
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        row = logits[i]
        if histories is not None and p.penalized:
            row = apply_penalties(row, p, *histories[i])
        elif p.greedy:
            continue
        out[i] = sample_row(row, p, generators[i])
    return out
