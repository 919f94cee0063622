"""CCNet-style perplexity with a Kiln model: per-token perplexity of each document under a
checkpoint (kiln checkpoint, HF folder or export), through the model's one forward, then
head / middle / tail buckets by corpus percentiles."""

from __future__ import annotations

import numpy as np

from kiln.model.formats.weights import build_model, read_weights
from kiln.text.tokenizer import load_tokenizer

BUCKETS = ("head", "middle", "tail")


class PerplexityScorer:
    """One model per process (a Ray Data actor holds one): batched, right-padded forward."""

    def __init__(self, model: str, tokenizer: str, max_tokens: int = 512, batch_size: int = 8):
        _, cfg, state = read_weights(model)
        self.model = build_model(cfg, state)
        self.device = next(self.model.parameters()).device
        self.tok = load_tokenizer(tokenizer)
        self.max_tokens = min(max_tokens, cfg.max_seq_len)
        self.batch_size = batch_size

    def perplexity(self, texts: list[str]) -> np.ndarray:
        """exp(mean next-token NLL) per text; NaN for texts of fewer than two tokens."""
        import torch

        # Scoped, never a process-wide set_grad_enabled(False): in a driver or test process that
        # would leak into every later training step.
        with torch.inference_mode():
            return self._perplexity(texts)

    def _perplexity(self, texts: list[str]) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        ids = [e.ids[: self.max_tokens] for e in self.tok.encode_batch(texts)]
        out = np.full(len(texts), np.nan)
        order = [i for i in np.argsort([len(x) for x in ids], kind="stable") if len(ids[i]) > 1]
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]  # similar lengths: little padding
            width = max(len(ids[i]) for i in rows)
            x = torch.zeros(len(rows), width, dtype=torch.long)
            mask = torch.zeros(len(rows), width - 1)
            for r, i in enumerate(rows):
                x[r, : len(ids[i])] = torch.tensor(ids[i])
                mask[r, : len(ids[i]) - 1] = 1
            logits = self.model(x.to(self.device)).float().cpu()  # causal: padding never seen
            nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), x[:, 1:], reduction="none")
            out[rows] = torch.exp((nll * mask).sum(1) / mask.sum(1)).numpy()
        return out


def bucket_cutoffs(
    ppl: np.ndarray, head_percent: float, tail_percent: float
) -> tuple[float, float]:
    """Perplexities below the first are `head`, above the second `tail` (CCNet's 33/33 split)."""
    finite = ppl[np.isfinite(ppl)]
    if not len(finite):
        return float("inf"), float("inf")
    return (
        float(np.percentile(finite, head_percent)),
        float(np.percentile(finite, 100 - tail_percent)),
    )


def buckets(ppl: np.ndarray, cuts: tuple[float, float]) -> np.ndarray:
    """head / middle / tail per document (no perplexity: tail)."""
    out = np.where(ppl <= cuts[0], "head", np.where(ppl <= cuts[1], "middle", "tail"))
    return np.where(np.isfinite(ppl), out, "tail").astype(object)
