"""Decode attention read in place from the paged KV cache: a small C++ op
(csrc/paged_attention.cpp, built once per machine with torch.utils.cpp_extension and cached),
as vLLM-CPU's paged-attention kernels do. Each decoding row's scores, softmax and weighted values
come straight from its blocks, so keys and values are read once; the torch path (PackedBatch's
gather into a padded [rows, Hkv, end, Dh] buffer, then SDPA) moves them three times.

The op is optional: without a C++ compiler or ninja, on a head size it does not take, or with
KILN_PAGED_ATTENTION=torch, the caller keeps the gather path; `decode` is the op's contract and
`decode_reference` the same contract in plain torch (the tests hold one to the other).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
ENV = "KILN_PAGED_ATTENTION"  # "torch": never build or use the op

HEAD_DIMS = (32, 64, 128)  # what csrc's dispatch takes with 8- and 16-float vectors

# at::vec picks its instruction set from these macros, as torch's own kernels are built per ISA
_ISA_FLAGS = {
    "AVX512": [
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mavx2",
        "-mfma",
        "-mf16c",
    ],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}

BUILD_DIR: str | None = None  # where the op is built (None: torch's extension cache)

_lock = threading.Lock()
_state: dict[str, object] = {}  # "op": the loaded op or None once a load was tried


def available() -> bool:
    """Whether the op is loaded (building it on first call; False, logged once, if it cannot)."""
    with _lock:
        if "op" not in _state:
            _state["op"] = _load()
    return _state["op"] is not None


def takes(head_dim: int, v_head_dim: int, dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether the op handles this shape, dtype and device (else the caller gathers)."""
    return (
        device == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and head_dim == v_head_dim
        and head_dim in HEAD_DIMS
        and available()
    )


def decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q [R, Hkv, G, Dh] (row r's G query heads of kv head h), pools [blocks, block_size, Hkv,
    Dh] -> [R, Hkv, G, Dv]: row r attends over its first lengths[r] positions (the last
    `window` of them when given), position p living in slot p % block_size of block
    table[r, p // block_size]."""
    if not available():
        raise RuntimeError("the paged attention op is unavailable here (see the log)")
    return torch.ops.kiln_paged.decode(
        q.contiguous(), k_pool, v_pool, table, lengths, float(scale), int(window or 0)
    )


def decode_reference(q, k_pool, v_pool, table, lengths, scale, window=None) -> torch.Tensor:
    """`decode` in plain torch, row by row, fp32 softmax: the op's definition for tests."""
    bs = k_pool.shape[1]
    out = []
    for r in range(q.shape[0]):
        n = int(lengths[r])
        first = max(0, n - window) if window else 0
        pos = torch.arange(first, n)
        slots = table[r, pos // bs] * bs + pos % bs
        keys = k_pool.flatten(0, 1)[slots].float().transpose(0, 1)  # [Hkv, n, Dh]
        values = v_pool.flatten(0, 1)[slots].float().transpose(0, 1)
        scores = q[r].float() @ keys.transpose(1, 2) * scale  # [Hkv, G, n]
        out.append((torch.softmax(scores, -1) @ values).to(q.dtype))
    return torch.stack(out)


def _load():
    if os.environ.get(ENV, "").lower() == "torch":
        return None
    try:
        from torch.utils import cpp_extension  # imports setuptools: only when building

        _put_ninja_on_path()

        isa = torch.backends.cpu.get_cpu_capability()
        flags = _ISA_FLAGS.get(isa, [])
        # the source's path too: torch's cache is per user, and its build.ninja names the
        # source file, so two checkouts (or venvs) of the same source on one machine would
        # each rebuild the op (~17 CPU s) whenever the other had built it last
        digest = hashlib.sha1(
            SOURCE.read_bytes() + " ".join(flags).encode() + str(SOURCE.resolve()).encode()
        ).hexdigest()[:10]
        cpp_extension.load(
            name=f"kiln_paged_attention_{isa.lower()}_{digest}",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", *flags],
            build_directory=BUILD_DIR,
            is_python_module=False,
            verbose=False,
        )
        return torch.ops.kiln_paged.decode
    except Exception as exc:  # no compiler, no ninja, a build error: keep the torch path
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("paged attention op unavailable, gathering instead: %s", first_line)
        return None


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` wheel (a dependency) puts it in the venv's
    bin, which is not on PATH when the venv is not activated (`.venv/bin/kiln serve`)."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
