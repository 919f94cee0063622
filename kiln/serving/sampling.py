"""Sampling parameters and next-token selection: greedy, temperature, top-k, top-p, seeded."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """How to pick tokens. temperature 0 is greedy; top_k 0 and top_p 1.0 switch those filters off."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(64, ge=0, description="Generate at most this many tokens.")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy (argmax).")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0: all).")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Keep the smallest set with this much mass."
    )
    stop: list[str] = Field(default_factory=list, description="Stop before any of these strings.")
    seed: int | None = Field(None, description="Seed for sampling (same seed, same text).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens outside top-k and outside the top-p nucleus of one row [V]."""
    if top_k and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
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


def sample_next(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Pick one token per row of `logits` [B, V] with that row's parameters; returns [B] int64."""
    logits = logits.float()
    out = logits.argmax(dim=-1)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = filter_logits(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(row, dim=-1)
        out[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return out
