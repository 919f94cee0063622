"""malloc_tuning.py: in a fresh process, a step's large buffers allocated again after a free
reuse the freed memory (next to no page faults) where glibc's defaults map and fault them in
anew; a user's own malloc tunables are left alone. Each case runs in a subprocess so pytest's
process keeps glibc's defaults."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import resource, sys
import torch
from kiln.training.rl.malloc_tuning import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "tuned" else False
def step():  # a training step's pattern: large buffers written, then freed
    bufs = [torch.ones(16 << 20) for _ in range(2)]  # 2 x 64 MiB: past mmap's 32 MiB cap
    del bufs
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> tuple[str, int]:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run_env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        env={**run_env, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_freed_memory_is_reused_instead_of_faulted_in_again():
    applied, tuned = _faults("tuned")
    _, default = _faults("default")
    assert applied == "True"
    pages = 5 * 2 * (64 << 20) // 4096  # what 5 steps touch: glibc's default faults them in
    assert default > pages // 2
    assert tuned < default // 5  # measured: 1/10 (one buffer's pages once, then none)


def test_a_users_malloc_tunables_are_kept():
    applied, _ = _faults("tuned", MALLOC_ARENA_MAX="2")
    assert applied == "False"
