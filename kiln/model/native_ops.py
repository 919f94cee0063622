"""Kiln's C++ CPU ops (csrc/*.cpp): each is built on first use with torch.utils.cpp_extension,
for the instruction set torch itself runs here, and cached per machine (the source's hash is in
the library's name, so an edited source builds afresh). Every op is optional: a caller asks
`load(name)` and keeps its torch path when the answer is False (no C++ compiler, no ninja, a
build error), which is logged once.
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

CSRC = Path(__file__).parent / "csrc"

# at::vec picks its instruction set from these macros, as torch's own kernels are built per ISA
ISA_FLAGS = {
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

BUILD_DIR: str | None = None  # where ops are built (None: torch's extension cache)

_lock = threading.Lock()
_loaded: dict[str, bool] = {}  # source name -> whether its op loaded, once a load was tried


def load(name: str, what: str, fallback: str) -> bool:
    """Build and load csrc/<name>.cpp once per process; False if it cannot, logged as
    "<what> unavailable, <fallback>: <reason>"."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = _build(name, what, fallback)
        return _loaded[name]


def _build(name: str, what: str, fallback: str) -> bool:
    source = CSRC / f"{name}.cpp"
    try:
        from torch.utils import cpp_extension  # imports setuptools: only when building

        _put_ninja_on_path()
        isa = torch.backends.cpu.get_cpu_capability()
        flags = ISA_FLAGS.get(isa, [])
        # the source's path too: torch's cache is per user and its build.ninja names the source
        # file, so two checkouts of one source would each rebuild whenever the other built last
        key = source.read_bytes() + " ".join(flags).encode() + str(source.resolve()).encode()
        digest = hashlib.sha1(key).hexdigest()[:10]
        cpp_extension.load(
            name=f"kiln_{name}_{isa.lower()}_{digest}",
            sources=[str(source)],
            extra_cflags=["-O3", *flags],
            build_directory=BUILD_DIR,
            is_python_module=False,
            verbose=False,
        )
        return True
    except Exception as exc:  # no compiler, no ninja, a build error: the caller's torch path
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning("%s unavailable, %s: %s", what, fallback, first_line)
        return False


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
