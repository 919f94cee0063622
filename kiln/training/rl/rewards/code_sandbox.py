"""Run model-written Python against unit tests in a limited subprocess.

The child (sandbox_runner.py) runs in `python -I` (no user site, no PYTHON* variables) with a
fresh temporary folder as cwd and HOME, a minimal environment, its own process group, and:
resource limits (CPU seconds, address space, file size, no core files; no new processes where
the user is not root), an audit hook installed before the code runs that refuses sockets,
process creation (fork, exec, spawn, subprocess, kill), ctypes, and writes or file changes
outside the folder; stdout/stderr kept to their first `output_chars`. The parent kills the
whole process group at the wall-clock timeout and removes the folder.

It is not a security boundary like a container or a VM (see docs/post-training.md): it stops the
mistakes and accidents of model-written code during training, not a determined attacker.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

RUNNER = str(Path(__file__).with_name("sandbox_runner.py"))
SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded (output or a file too large)",
    signal.SIGSEGV: "crashed (SIGSEGV; often the memory limit)",
    signal.SIGABRT: "aborted (SIGABRT; often the memory limit)",
}


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock, then the process group is killed
    cpu_s: int = 5
    memory_mb: int = 512  # address space
    file_size_mb: int = 8  # any one file written, the captured output included
    output_chars: int = 4096  # stdout and stderr each


@dataclass
class SandboxResult:
    passed: int
    total: int
    reason: str | None  # None when every test passed
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reason is None and self.total > 0 and self.passed == self.total


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _parse(stdout_file: Path, nonce: str) -> dict | None:
    with open(stdout_file, "rb") as f:
        f.seek(max(0, stdout_file.stat().st_size - 64 * 1024))
        tail = f.read().decode("utf-8", "replace")
    for line in reversed(tail.splitlines()):
        if line.startswith(nonce + " "):
            return json.loads(line[len(nonce) + 1 :])
    return None


def run_sandboxed(code: str, tests: str | list[str], limits: SandboxLimits) -> SandboxResult:
    """Run `code` then each test (an assert statement) in a sandboxed subprocess."""
    nonce = secrets.token_hex(16)
    request = json.dumps(
        {
            "code": code,
            "tests": tests,
            "nonce": nonce,
            "limits": {
                "cpu_s": limits.cpu_s,
                "memory_mb": limits.memory_mb,
                "file_size_mb": limits.file_size_mb,
                "output_chars": limits.output_chars,
            },
        }
    )
    parent = tempfile.mkdtemp(prefix="kiln-sandbox-")
    folder = os.path.join(parent, "work")  # the child's; its output files stay outside it
    os.mkdir(folder)
    env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
    # one thread per math library: RLIMIT_NPROC leaves none to start (for a non-root user),
    # and many sandboxes run side by side
    env |= {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    stdout_file, stderr_file = Path(parent, "stdout"), Path(parent, "stderr")
    total = len(tests) if isinstance(tests, list) else 0
    try:
        with open(stdout_file, "wb") as out, open(stderr_file, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", RUNNER],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=folder,
                env=env,
                start_new_session=True,  # its own process group, killed as one
                close_fds=True,
            )
            try:
                proc.communicate(request.encode(), timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return SandboxResult(0, total, f"timed out after {limits.timeout_s:g} s")
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
        result = _parse(stdout_file, nonce)
        if result is None:
            code_ = proc.returncode
            if code_ < 0:
                sig = signal.Signals(-code_)
                reason = SIGNAL_REASONS.get(sig, f"killed by {sig.name}")
            else:
                err_tail = stderr_file.read_text("utf-8", "replace").strip().splitlines()
                reason = f"the sandbox exited with status {code_}" + (
                    f": {err_tail[-1][:300]}" if err_tail else ""
                )
            return SandboxResult(0, total, reason)
        return SandboxResult(
            passed=result["passed"],
            total=result["total"],
            reason=result["reason"],
            stdout=result["stdout"],
            stderr=result["stderr"],
        )
    finally:
        shutil.rmtree(parent, ignore_errors=True)
