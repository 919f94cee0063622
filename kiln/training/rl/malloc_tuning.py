"""glibc's malloc told to keep freed memory for reuse, in the `kiln grpo` / `kiln distill`
process only (commands.py calls it; library code and tests never do).

glibc serves allocations above its mmap threshold (128 KiB, growing to at most 32 MiB) with a
fresh mmap and returns them to the kernel on free. A training step allocates and frees the same
activations and gradients every step, so each step maps them afresh and the kernel zero-fills
every page on first touch: 150-500k page faults and 0.2-0.6 s of system time per SmolLM2 GRPO
update on CPU. With mmap off (M_MMAP_MAX 0) and the heap's top trimmed only past 1 GiB free
(M_TRIM_THRESHOLD), freed blocks stay in the heap and the next step reuses them: the process
keeps its peak heap mapped (its RSS stays at the step's peak instead of falling between steps).

The settings apply to this process from the call on; a user who set glibc's own tunables
(MALLOC_*_ environment variables or GLIBC_TUNABLES) keeps theirs. Not glibc (musl, macOS): a
no-op."""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 1 << 30


def user_tuned() -> bool:
    """Whether the environment already sets glibc malloc's tunables."""
    return any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


def keep_freed_memory() -> bool:
    """Apply the settings above; True when they were applied."""
    if user_tuned():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no glibc
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
