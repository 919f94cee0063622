"""Verification of drafted tokens against the target model's logits at every drafted position
(one forward over the last token and the k drafts gives k + 1 rows of logits).

Greedy rows keep the drafts up to the first one that differs from the target's argmax, then
take the target's own token there (or, all drafts kept, the token after them): exactly the
tokens plain greedy decoding would have picked. Sampled rows use the standard rule (Leviathan
et al. 2023, Chen et al. 2023): draft d drawn from q is kept with probability min(1, p(d)/q(d));
the first rejected one is replaced by a token drawn from norm(max(0, p - q)); all kept, one more
token is drawn from p. Every emitted token is then distributed exactly as under plain sampling
from p (the row's temperature / top-k / top-p distribution, `sampling_probs`). A prompt-lookup
draft is a point mass: q = 1 at d, so d is kept with probability p(d) and a rejection resamples
from p without d.
"""

from __future__ import annotations

import torch

from kiln.engine.sampler import SamplingParams, sampling_probs


def verify_greedy(drafts: list[int], target_tokens: list[int]) -> list[int]:
    """The tokens to emit: the drafts the target's argmax (`target_tokens`, one per position,
    len(drafts) + 1 of them) agrees with, then the target's token at the first disagreement
    or after the last draft. Always at least one token."""
    out = []
    for draft, target in zip(drafts, target_tokens, strict=False):
        out.append(target)
        if target != draft:
            return out
    out.append(target_tokens[len(drafts)])
    return out


def verify_sampled(
    drafts: list[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    draft_probs: list[torch.Tensor | None] | None = None,
) -> list[int]:
    """The tokens to emit for one sampled row: `target_logits` [len(drafts) + 1, V];
    `draft_probs[j]` the distribution draft j was drawn from (None, or no list: a point mass at
    the draft, as prompt lookup's)."""
    out = []
    for j, draft in enumerate(drafts):
        p = sampling_probs(target_logits[j], params)
        if p is None:  # an ill-defined distribution: the row takes its argmax, as sample_row
            token = _argmax(target_logits[j])
            out.append(token)
            if token != draft:
                return out
            continue
        q = draft_probs[j] if draft_probs is not None else None
        q_draft = float(q[draft]) if q is not None else 1.0
        u = float(torch.rand((), dtype=torch.float64, generator=generator, device=p.device))
        if u * q_draft < float(p[draft]):  # u < p/q: accepted with probability min(1, p/q)
            out.append(draft)
            continue
        if q is None:
            residual = p.clone()
            residual[draft] = 0.0
        else:
            residual = (p - q.to(p.dtype)).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: the residual is p itself
            residual = p
        out.append(int(torch.multinomial(residual, 1, generator=generator)[0]))
        return out
    last = target_logits[len(drafts)]
    p = sampling_probs(last, params)
    out.append(_argmax(last) if p is None else int(torch.multinomial(p, 1, generator=generator)[0]))
    return out


def draw_draft(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[int, torch.Tensor | None]:
    """A draft model's token from one row [V] of its logits and the distribution q it was drawn
    from (the row's own sampling transform); greedy rows (and ill-defined ones) take the argmax,
    a point mass (None)."""
    q = sampling_probs(logits, params)
    if q is None:
        return _argmax(logits), None
    return int(torch.multinomial(q, 1, generator=generator)[0]), q


def _argmax(logits: torch.Tensor) -> int:
    return int(torch.nan_to_num(logits.double(), nan=float("-inf")).argmax())
