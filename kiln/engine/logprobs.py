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


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable-character map that byte-level BPE vocabularies are written in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = dict(zip(map(chr, keep), keep, strict=True)), 0
    for b in range(256):
        if b not in keep:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes of one token (a byte-level token may be half a UTF-8 character)."""
    piece = tokenizer.id_to_token(token_id) or ""
    if piece and all(c in BYTE_LEVEL for c in piece):
        return bytes(BYTE_LEVEL[c] for c in piece)
    return piece.replace("▁", " ").encode()  # SentencePiece-style pieces
