"""Dedup's memory, checked before it starts: what exact, fuzzy and semantic dedup hold in memory
grows with the document count (the shuffles themselves spill to disk), so a corpus too large for
the limit fails up front, saying how much it needs, instead of being OOM-killed mid-way.

The per-document figures are measured, not derived: bench/curator_memory.py ran `kiln curate`
on 250k to 4M documents; between 1M and 4M the driver grew 0.43 GiB per million documents
(candidate texts held for verification, duplicate row lists, the output permutation) on top of
Dask's in-memory shuffle buffer (partd spills past 1 GiB). Semantic dedup keeps every
embedding (float32, the MiniLM model's 384 dimensions) and a normalised copy for k-means.
"""

from __future__ import annotations

import os

from kiln.curator.dedup.config import DedupConfig
from kiln.platform.errors import ConfigError

GIB = 2**30
SHUFFLE_BUFFER_BYTES = 1 * GIB
EXACT_FUZZY_BYTES_PER_DOC = int(0.43 * GIB / 1_000_000)
SEMANTIC_BYTES_PER_DOC = 2 * 384 * 4
SEMANTIC_MODEL_BYTES = 256 * 2**20  # the embedding model and its activations per batch
DEFAULT_SHARE_OF_AVAILABLE = 0.8


def dedup_memory_needs(n_docs: int, cfg: DedupConfig) -> dict[str, int]:
    """Bytes each enabled in-memory part of dedup needs for `n_docs` documents."""
    needs: dict[str, int] = {}
    if cfg.exact or cfg.fuzzy.enabled:
        needs["exact+fuzzy"] = SHUFFLE_BUFFER_BYTES + EXACT_FUZZY_BYTES_PER_DOC * n_docs
    if cfg.semantic.enabled:
        needs["semantic"] = SEMANTIC_MODEL_BYTES + SEMANTIC_BYTES_PER_DOC * n_docs
    return needs


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else all RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def dedup_memory_limit(cfg: DedupConfig) -> tuple[int, str]:
    """The limit in bytes and where it came from (for the error message)."""
    if cfg.memory_limit_mb is not None:
        return int(cfg.memory_limit_mb * 2**20), f"dedup.memory_limit_mb = {cfg.memory_limit_mb:g}"
    available = available_memory_bytes()
    limit = int(available * DEFAULT_SHARE_OF_AVAILABLE)
    return limit, f"80% of this machine's available memory ({available / GIB:.1f} GiB)"


def check_dedup_memory(n_docs: int, cfg: DedupConfig) -> dict[str, int]:
    """Raise a one-line ConfigError when dedup of `n_docs` documents would exceed the limit."""
    needs = dedup_memory_needs(n_docs, cfg)
    limit, source = dedup_memory_limit(cfg)
    total = sum(needs.values())
    if total > limit:
        parts = ", ".join(f"{name} {size / GIB:.2f} GiB" for name, size in needs.items())
        raise ConfigError(
            f"dedup of {n_docs:,} documents needs about {total / GIB:.2f} GiB in memory "
            f"({parts}), above the limit of {limit / GIB:.2f} GiB ({source}): raise "
            "dedup.memory_limit_mb "
            "on a larger machine, turn off semantic dedup, or curate the input in parts"
        )
    return needs
