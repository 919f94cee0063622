"""Sample sources: an endless, deterministic stream of samples addressed by a global sample number.

A source maps global sample j to `seq_len + 1` tokens. Indexed data is read in passes: pass p is
a fresh `GPTDataset` (or blend) shuffled with seed `seed + p`, so the stream never ends and sample
j is a pure function of (data, seed, j) — which is what makes the loader's state one integer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from kiln.platform.errors import ConfigError, InputError
from kiln.text.indexed_dataset import IndexedDataset, exists
from kiln.training.data.blended_dataset import BlendedDataset
from kiln.training.data.config import DataConfig
from kiln.training.data.gpt_dataset import GPTDataset

TOKENS_META = "tokens.json"  # written by the tokenize stage next to the split prefixes


def resolve_prefix(path: str, split: str) -> str:
    """A TokenDataset directory (then `split` picks `<dir>/<split>`) or a raw `.bin/.idx` prefix."""
    p = Path(path)
    if p.is_dir():
        prefix = str(p / split)
        if exists(prefix):
            return prefix
        found = sorted(x.stem for x in p.glob("*.idx"))
        raise InputError(
            f"data.paths: {path} has no split {split!r} (found {found or 'no .idx files'})"
        )
    prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
    if exists(prefix):
        return prefix
    raise InputError(
        f"data.paths: {path} is neither a TokenDataset directory nor a <prefix>.bin/.idx pair"
    )


def dataset_vocab_size(path: str) -> int | None:
    """The vocabulary size a TokenDataset directory records, if it records one."""
    meta = Path(path) / TOKENS_META
    if meta.is_file():
        return json.loads(meta.read_text()).get("vocab_size")
    return None


class IndexedSource:
    """Indexed datasets (one, or several blended by weight), read pass after pass."""

    def __init__(
        self, cfg: DataConfig, seq_len: int, seed: int, vocab_size: int | None = None
    ) -> None:
        if not cfg.paths:
            raise ConfigError(
                "data.paths: expected at least one dataset path (or data.synthetic: true)"
            )
        if cfg.weights is not None and len(cfg.weights) != len(cfg.paths):
            raise ConfigError(
                f"data.weights: {len(cfg.weights)} weights for {len(cfg.paths)} paths"
            )
        for path in cfg.paths:
            v = dataset_vocab_size(path) if os.path.isdir(path) else None
            if vocab_size is not None and v is not None and v > vocab_size:
                raise ConfigError(
                    f"data.paths: {path} was tokenised with vocab {v} "
                    f"> model vocab_size {vocab_size}"
                )
        self.datasets = [IndexedDataset(resolve_prefix(p, cfg.split)) for p in cfg.paths]
        self.weights = cfg.weights or [1.0] * len(self.datasets)
        self.seq_len = seq_len
        self.seed = seed
        self.cache_dir = cfg.index_cache_dir
        self._passes: dict[int, GPTDataset | BlendedDataset] = {}
        self.pass_length = len(self._pass(0))
        if self.pass_length == 0:
            raise InputError(f"data.paths: too few tokens for one sample of {seq_len + 1}")

    def _pass(self, p: int) -> GPTDataset | BlendedDataset:
        if p not in self._passes:
            parts = []
            for ds in self.datasets:
                try:
                    parts.append(
                        GPTDataset(ds, self.seq_len, self.seed + p, cache_dir=self.cache_dir)
                    )
                except ValueError as e:
                    raise InputError(f"data.paths: {ds.prefix}: {e}") from None
            built = parts[0] if len(parts) == 1 else BlendedDataset(parts, self.weights)
            # keep this pass and the previous one mapped
            self._passes = {k: v for k, v in self._passes.items() if k >= p - 1}
            self._passes[p] = built
        return self._passes[p]

    def gather(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        first, last = int(ids[0]) // self.pass_length, int(ids[-1]) // self.pass_length
        if first == last:  # the usual case: the whole batch from one pass
            return self._pass(first).gather(ids - first * self.pass_length)
        passes, local = np.divmod(ids, self.pass_length)
        out = np.empty((len(ids), self.seq_len + 1), dtype=np.int64)
        for p in np.unique(passes):
            mask = passes == p
            out[mask] = self._pass(int(p)).gather(local[mask])
        return out

    def gather_range(self, first: int, count: int) -> np.ndarray:
        p, local = divmod(first, self.pass_length)
        if local + count <= self.pass_length:  # the usual case: the whole batch from one pass
            return self._pass(p).gather_range(local, count)
        return self.gather(np.arange(first, first + count))


class SyntheticSource:
    """Seeded random tokens: sample j is drawn from a generator keyed by (seed, j)."""

    def __init__(self, vocab_size: int | None, seq_len: int, seed: int) -> None:
        if not vocab_size:
            raise ConfigError("data.synthetic: vocab_size is required for synthetic data")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def gather(self, ids: np.ndarray) -> np.ndarray:
        return np.stack(
            [
                np.random.default_rng([self.seed, int(j)]).integers(
                    0, self.vocab_size, self.seq_len + 1
                )
                for j in ids
            ]
        ).astype(np.int64)

    def gather_range(self, first: int, count: int) -> np.ndarray:
        return self.gather(np.arange(first, first + count))
