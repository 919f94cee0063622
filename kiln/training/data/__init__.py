"""Tokens: tokenizer training, Megatron indexed datasets, the GPT dataset and the training loader.

`build_dataloader` is what the trainer calls; heavy imports happen inside it so the CLI stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.training.data.config import DataConfig

if TYPE_CHECKING:
    from kiln.training.data.loader import TokenLoader


def build_dataloader(
    cfg: DataConfig,
    *,
    seq_len: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
    vocab_size: int | None = None,
) -> TokenLoader:
    """An endless, resumable loader of `(tokens, labels)` [micro_batch_size, seq_len] int64 batches.

    Only data-parallel ranks split the data: TP/CP/PP ranks of one replica pass the same `dp_rank`.
    `cfg.seed` (if set) overrides `seed` for shuffling.
    """
    from kiln.training.data.loader import TokenLoader
    from kiln.training.data.sources import IndexedSource, SyntheticSource

    data_seed = seed if cfg.seed is None else cfg.seed
    if cfg.synthetic:
        source = SyntheticSource(vocab_size, seq_len, data_seed)
        description = {"source": "synthetic", "seed": data_seed}
    else:
        source = IndexedSource(cfg, seq_len, data_seed, vocab_size)
        description = {
            "source": "indexed",
            "seed": data_seed,
            "paths": list(cfg.paths),
            "split": cfg.split,
        }
    return TokenLoader(
        source,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
        prefetch=cfg.prefetch,
        description=description,
    )


__all__ = ["DataConfig", "build_dataloader"]
