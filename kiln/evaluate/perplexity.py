"""Held-out perplexity of a model on a split of a TokenDataset (the `tokenize` stage's output).

The split's tokens (documents already end with the end-of-document token) are read as one stream
and cut into non-overlapping windows of `seq_len + 1` tokens; each window scores its last
`seq_len` tokens given the ones before it inside the window (the first token of a window is
context only, as in Megatron's and nanoGPT's evaluation). Perplexity = exp(summed NLL / tokens).
The forward is kiln's one model forward (kiln.model), in batches, without a KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kiln.engine.generator import Generator
from kiln.platform.errors import InputError
from kiln.text import indexed_dataset

# the default window: the model's context, but no longer than this (logits are [B, S, vocab])
DEFAULT_MAX_WINDOW = 1024


@dataclass(frozen=True)
class Perplexity:
    split: str
    tokens: int  # tokens scored
    windows: int
    seq_len: int
    nll: float  # mean negative log-likelihood per scored token (nats)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll)

    def as_dict(self) -> dict:
        return {
            "split": self.split,
            "perplexity": self.perplexity,
            "nll": self.nll,
            "tokens": self.tokens,
            "windows": self.windows,
            "seq_len": self.seq_len,
        }


def split_tokens(dataset_dir: str | Path, split: str, max_tokens: int | None = None) -> np.ndarray:
    """All tokens of one split of a TokenDataset, in document order (at most `max_tokens`)."""

    prefix = Path(dataset_dir) / split
    if not indexed_dataset.exists(prefix):
        raise InputError(f"evaluate.perplexity.split: {prefix}.bin/.idx not found in {dataset_dir}")
    ds = indexed_dataset.IndexedDataset(prefix)
    n = ds.num_tokens if max_tokens is None else min(ds.num_tokens, max_tokens)
    first = int(ds.token_offsets[0]) if len(ds) else 0
    # kiln and Megatron write a split's sequences back to back: one slice reads them all
    return np.asarray(ds.tokens[first : first + n], dtype=np.int64)


def windows(tokens: np.ndarray, seq_len: int) -> torch.Tensor:
    """[N, seq_len + 1] non-overlapping windows (a shorter tail is dropped unless it is all)."""
    size = seq_len + 1
    n = len(tokens) // size
    if n == 0:
        if len(tokens) < 2:
            raise InputError("evaluate.perplexity: the split holds fewer than 2 tokens")
        return torch.from_numpy(tokens[None, :].copy())
    return torch.from_numpy(tokens[: n * size].reshape(n, size).copy())


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, batches: torch.Tensor, *, batch_size: int = 8, split: str = "valid"
) -> Perplexity:
    """Perplexity of `model` (tokens [B, S] -> logits [B, S, V]) over windows [N, S + 1]."""
    model.eval()
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(batches), batch_size):
        chunk = batches[start : start + batch_size].to(device)
        logits = model(chunk[:, :-1]).float()
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total_nll += float(nll)
        total_tokens += chunk[:, 1:].numel()
    return Perplexity(
        split=split,
        tokens=total_tokens,
        windows=len(batches),
        seq_len=batches.shape[1] - 1,
        nll=total_nll / total_tokens,
    )


def dataset_perplexity(
    model_dir: str,
    dataset_dir: str | Path,
    *,
    split: str = "valid",
    seq_len: int | None = None,
    batch_size: int = 4,
    max_tokens: int | None = None,
) -> Perplexity:
    """Load the model (exported HF folder, ExportedModel or kiln checkpoint) and score a split."""

    model = Generator.load(model_dir).model
    seq_len = seq_len or min(model.cfg.max_seq_len, DEFAULT_MAX_WINDOW)
    if seq_len > model.cfg.max_seq_len:
        raise InputError(
            f"evaluate.perplexity.seq_len: {seq_len} exceeds the model's context "
            f"({model.cfg.max_seq_len})"
        )
    tokens = split_tokens(dataset_dir, split, max_tokens)
    vocab = model.cfg.vocab_size
    if len(tokens) and int(tokens.max()) >= vocab:
        raise InputError(
            f"evaluate.perplexity: token id {int(tokens.max())} in {dataset_dir}/{split} is "
            f"outside the model's vocabulary ({vocab}): tokenized with another tokenizer?"
        )
    return perplexity(model, windows(tokens, seq_len), batch_size=batch_size, split=split)
