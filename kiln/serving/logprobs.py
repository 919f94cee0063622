"""Token log-probabilities under the model: the prompt's (`echo` + `logprobs`, what
log-likelihood scoring needs) and the completion's (`logprobs`).

One forward of the model's own `forward` over prompt + completion scores every token at once:
position i's log-softmax gives token i+1's log-probability and the top alternatives. The values
are the model's raw distribution (before temperature, top-k/p and penalties), as vLLM reports
by default; the first token of a sequence has none (OpenAI's `null`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class TokenScore:
    token_id: int
    logprob: float | None  # None for the first token (nothing before it to condition on)
    top: list[tuple[int, float]]  # the `top` most likely tokens at this position, best first


@torch.inference_mode()
def score_tokens(model: nn.Module, ids: list[int], top: int = 0) -> list[TokenScore]:
    """Log-probability of every token of `ids` given the ones before it, plus the top-`top`
    alternatives at each position (computed in float64 from the model's logits)."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device))[0, :-1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    targets = torch.tensor(ids[1:], device=device)
    chosen = logp.gather(1, targets[:, None])[:, 0].tolist()
    if top > 0:
        values, indices = logp.topk(min(top, logp.shape[-1]), dim=-1)
        tops = [
            list(zip(i, v, strict=True))
            for i, v in zip(indices.tolist(), values.tolist(), strict=True)
        ]
    else:
        tops = [[] for _ in chosen]
    out = [TokenScore(ids[0], None, [])]
    out += [TokenScore(t, lp, tp) for t, lp, tp in zip(ids[1:], chosen, tops, strict=True)]
    return out
