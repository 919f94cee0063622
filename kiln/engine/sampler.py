"""Sampling parameters and next-token selection: greedy, temperature, top-k, top-p, penalties,
seeded. Every row of a batch is sampled with its own parameters, in a numerically safe way: a row
whose distribution cannot be formed (non-finite logits) falls back to its argmax instead of
failing the whole batch."""

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
    return filter_rows(logits[None], [top_k], [top_p])[0]


def filter_rows(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """`filter_logits` on every row of [n, V] with that row's top_k and top_p; each filter
    runs on the rows that ask for it, all of them at once (a row's values are the same as on
    its own: topk, sort, softmax and cumsum work along the row)."""
    vocab = logits.shape[-1]
    k_rows = [i for i, k in enumerate(top_k) if k and k < vocab]
    if k_rows:
        index = torch.tensor(k_rows, device=logits.device)
        k = torch.tensor([top_k[i] for i in k_rows], device=logits.device)
        rows = logits[index]
        kth = torch.topk(rows, int(k.max()), dim=-1).values.gather(-1, (k - 1)[:, None])
        logits = logits.index_copy(0, index, rows.masked_fill(rows < kth, float("-inf")))
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0]
    if p_rows:
        index = torch.tensor(p_rows, device=logits.device)
        p = torch.tensor([top_p[i] for i in p_rows], dtype=torch.float64, device=logits.device)
        rows = logits[index]
        sorted_logits, order = torch.sort(rows, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always
        # stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= p[:, None].to(probs.dtype)
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.index_copy(0, index, rows.masked_fill(drop, float("-inf")))
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
    if params.greedy:
        return None
    probs, valid = sampling_probs_rows(logits[None], [params])
    return probs[0] if bool(valid[0]) else None


def sampling_probs_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampling_probs` of every row of [n, V] logits with its own (non-greedy) parameters, all
    rows at once: the distributions [n, V] (float64) and whether each could be formed [n]
    (False: non-finite logits; that row takes its argmax). Each row's numbers equal those of the
    row on its own (every step works along the row; tests/engine/test_sampler.py)."""
    logits = logits.double()
    finite = torch.isfinite(logits)
    if bool(finite.all()):  # the usual case: nothing to mask, every row can be sampled
        valid = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
        finite_max = logits.amax(-1, keepdim=True)
    else:  # NaN to -inf; +-inf to the largest finite values (nan_to_num's defaults)
        logits = torch.nan_to_num(logits, nan=float("-inf"))
        finite = torch.isfinite(logits)
        valid = finite.any(-1)
        finite_max = logits.masked_fill(~finite, float("-inf")).amax(-1, keepdim=True)
        finite_max = finite_max.masked_fill(~valid[:, None], 0.0)  # rows with none: unused
    # shifting by the max first keeps logits / temperature finite for any temperature >= 1e-5
    temperature = torch.tensor(
        [max(p.temperature, TEMPERATURE_MIN) for p in params],
        dtype=torch.float64,
        device=logits.device,
    )
    rows = (logits - finite_max).clamp(min=-1e300) / temperature[:, None]
    rows = filter_rows(rows, [p.top_k for p in params], [p.top_p for p in params])
    probs = torch.softmax(rows, dim=-1)
    valid &= torch.isfinite(probs).all(-1) & (probs.sum(-1) > 0)
    return probs, valid


def sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """One token from one row [V] of float logits; argmax whenever sampling is ill-defined."""
    probs = sampling_probs(logits, params)
    if probs is None:
        return int(torch.nan_to_num(logits.double(), nan=float("-inf")).argmax())
    return draw_rows(probs[None], [generator])[0]


def draw_rows(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of [n, V] distributions by inverse CDF: u ~ U[0, 1) from the row's
    own generator (one float64 per token, so a seeded row's stream does not depend on its
    batch), then the first token whose cumulative mass exceeds u x the row's total. A token of
    zero mass is never drawn. One number per draw, where `torch.multinomial` draws an
    exponential per vocabulary entry (its Gumbel-max path): that was most of a sampled token's
    cost at a 49k vocabulary."""
    device = probs.device
    u = _uniforms(generators, device)
    cdf = probs.double().cumsum(-1)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].tolist()
    vocab = probs.shape[-1]
    for i, token in enumerate(tokens):
        if token == vocab:  # u x total rounded up to the total: the last token with any mass
            tokens[i] = int(torch.nonzero(probs[i]).max())
    return tokens


def _uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One float64 in [0, 1) from each generator, [n]. On CPU the draws travel as Python floats
    (exact) into one tensor: a one-element tensor per row and their concatenation took twice
    as long at a batch's 32 rows; elsewhere `item()` would wait on the device once a row."""
    if device.type == "cpu":
        draws = [torch.rand(1, dtype=torch.float64, generator=g).item() for g in generators]
        return torch.tensor(draws, dtype=torch.float64)
    return torch.cat(
        [torch.rand(1, dtype=torch.float64, generator=g, device=device) for g in generators]
    )


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
    allows, before greedy and sampled rows alike pick.

    Every row gets what `sample_row` gives it alone: the distributions of all sampled rows are
    formed at once, and each row draws one number from its own generator (`draw_rows`)."""
    tokens = sample_tokens(logits, params, generators, histories, grammars)
    return torch.tensor(tokens, dtype=torch.long, device=logits.device)


def sample_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
    grammars: Sequence[GrammarMatcher | None] | None = None,
) -> list[int]:
    """`sample_next` as a list of token ids, what the engine reads; rows that are all drawn
    (an RL rollout's) skip the argmax and the row selections they would not change."""
    logits = logits.float()
    if grammars is not None and any(g is not None for g in grammars):
        logits = logits.clone()  # masked here; the caller's logits stay the model's
        apply_grammar_masks(logits, list(grammars))
    penalized = [histories is not None and p.penalized for p in params]
    work = [i for i, p in enumerate(params) if penalized[i] or not p.greedy]
    # every `work` row's token is set below: the argmax only for the others
    tokens = logits.argmax(dim=-1).tolist() if len(work) < len(params) else [0] * len(params)
    if not work:
        return tokens
    if len(work) == len(params) and not any(penalized):  # read only: no copy needed
        rows = logits
    else:
        rows = logits[torch.tensor(work, device=logits.device)]
    for j, i in enumerate(work):
        if penalized[i]:
            rows[j] = apply_penalties(rows[j], params[i], *histories[i])
    sampled = [j for j, i in enumerate(work) if not params[i].greedy]
    probs = valid = None
    if sampled:
        picked = rows if len(sampled) == len(work) else rows[sampled]
        probs, valid = sampling_probs_rows(picked, [params[work[j]] for j in sampled])
        valid = valid.tolist()
    formed = [n for n, ok in enumerate(valid or []) if ok]  # of `sampled`
    drawn = {sampled[n] for n in formed}
    for j, i in enumerate(work):  # penalized greedy rows and ill-defined ones: their argmax
        if j not in drawn:
            tokens[i] = int(torch.nan_to_num(rows[j].double(), nan=float("-inf")).argmax())
    if formed:
        if len(formed) < len(sampled):
            probs = probs[formed]
        picks = draw_rows(probs, [generators[work[sampled[n]]] for n in formed])
        for n, token in zip(formed, picks, strict=True):
            tokens[work[sampled[n]]] = token
    return tokens
