"""The child side of the code sandbox: run with `python -I sandbox_runner.py` in a fresh folder.

Reads {"code", "tests", "limits", "nonce"} as JSON on stdin; sets resource limits,
installs an audit hook that refuses the network, process creation, native code and writes outside
the folder; runs the code, then each test; prints one line `<nonce> <result JSON>` on stdout.
Standard library only: this file runs in an isolated interpreter without the project on its path.
"""

import ast
import io
import json
import os
import resource
import sys

PROCESS_EVENTS = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.kill",
    "os.killpg",
    "subprocess.Popen",
    "pty.spawn",
    "signal.pthread_kill",
)
# events whose first argument(s) are paths the call changes
PATH_EVENTS = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.rename": 2,
    "os.symlink": 2,
    "os.link": 2,
    "os.truncate": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.utime": 1,
    "shutil.rmtree": 1,
}
# the C modules behind subprocess, ctypes, socket and multiprocessing, by what they would allow
BLOCKED_IMPORTS = {
    "_posixsubprocess": "process creation",
    "_multiprocessing": "process creation",
    "_socket": "network access",
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxViolation(BaseException):
    """Not an Exception: user code's `except Exception` must not swallow a refusal."""


def install_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = int(limits["file_size_mb"]) * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # ignored for root; the audit hook is not
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def install_audit_hook(folder: str, violations: list) -> None:
    folder = os.path.realpath(folder)
    realpath, fspath = os.path.realpath, os.fspath

    def inside(path) -> bool:
        if isinstance(path, int):  # an already open descriptor
            return True
        full = realpath(fspath(path))
        return full == folder or full.startswith(folder + os.sep)

    def refuse(reason: str):
        violations.append(reason)
        raise SandboxViolation(reason)

    def hook(event: str, args: tuple) -> None:
        if event.startswith("socket."):
            refuse(f"network access refused ({event})")
        elif event.startswith(PROCESS_EVENTS):
            refuse(f"process creation refused ({event})")
        elif event.startswith("ctypes.") and not (event == "ctypes.dlopen" and args[0] is None):
            # `import ctypes` (numpy imports it) opens the process itself; any symbol looked
            # up, library loaded or foreign call after that is refused
            refuse(f"native code refused ({event})")
        elif event == "import" and args[0] in BLOCKED_IMPORTS:
            refuse(f"{BLOCKED_IMPORTS[args[0]]} refused (import {args[0]})")
        elif event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if writes and path is not None and not inside(path):
                refuse(f"write outside the sandbox folder refused ({path})")
        elif event in PATH_EVENTS:
            for path in args[: PATH_EVENTS[event]]:
                if path is not None and not inside(path):
                    refuse(f"change outside the sandbox folder refused ({event} {path})")

    sys.addaudithook(hook)


class CappedText(io.TextIOBase):
    """A stdout/stderr that keeps the first `cap` characters and drops the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.parts, self.size = cap, [], 0

    def write(self, text: str) -> int:
        if self.size < self.cap:
            self.parts.append(text[: self.cap - self.size])
        self.size += len(text)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts) + (" [truncated]" if self.size > self.cap else "")


def split_tests(tests) -> tuple[str, list[str]]:
    """(setup, tests): a list is one test per item; a string's top-level asserts are its tests
    and the other statements (imports, helpers) run first, in order, as setup."""
    if isinstance(tests, list):
        return "", [str(t) for t in tests]
    module = ast.parse(tests)
    setup = [ast.unparse(n) for n in module.body if not isinstance(n, ast.Assert)]
    asserts = [ast.unparse(n) for n in module.body if isinstance(n, ast.Assert)]
    if not asserts:  # a test script without asserts: it passes when it runs through
        return "", [tests]
    return "\n".join(setup), asserts


def describe(e: BaseException) -> str:
    if isinstance(e, MemoryError):
        return "memory limit exceeded (MemoryError)"
    if isinstance(e, RecursionError):
        return "RecursionError"
    text = " ".join(str(e).split())[:300]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run(request: dict, violations: list) -> dict:
    namespace = {"__name__": "__main__"}
    result = {"passed": 0, "total": 0, "reason": None}
    try:
        code = compile(request["code"], "<completion>", "exec")
    except SyntaxError as e:
        result["reason"] = f"the code does not compile: {e.msg} (line {e.lineno})"
        return result
    try:
        setup, tests = split_tests(request["tests"])
    except SyntaxError as e:
        result["reason"] = f"the tests do not compile: {e.msg} (line {e.lineno})"
        return result
    result["total"] = len(tests)
    try:
        exec(code, namespace)
        if setup:
            exec(compile(setup, "<tests>", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - SystemExit, violations and all: a failed run
        if violations:
            result["reason"] = violations[0]
        elif isinstance(e, MemoryError):
            result["reason"] = describe(e)
        else:
            result["reason"] = f"the code raised {describe(e)}"
        return result
    failures = []
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
            result["passed"] += 1
        except BaseException as e:  # noqa: BLE001
            first_line = test.strip().splitlines()[0][:200] if test.strip() else ""
            failures.append(f"test {i} failed: {first_line} ({describe(e)})")
    if violations:
        result["reason"] = violations[0]
    elif failures:
        result["reason"] = failures[0] + (
            f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        )
    return result


def main() -> None:
    request = json.loads(sys.stdin.read())
    nonce = request.pop("nonce")
    real_stdout = sys.stdout
    limits = request["limits"]
    out, err = CappedText(limits["output_chars"]), CappedText(limits["output_chars"])
    violations: list[str] = []
    install_limits(limits)
    install_audit_hook(os.getcwd(), violations)
    sys.stdout, sys.stderr = out, err
    try:
        result = run(request, violations)
    finally:
        sys.stdout, sys.stderr = real_stdout, sys.__stderr__
    if violations and not result["reason"]:
        result["reason"] = violations[0]
    result["stdout"], result["stderr"] = out.getvalue(), err.getvalue()
    real_stdout.write(f"\n{nonce} {json.dumps(result)}\n")
    real_stdout.flush()


if __name__ == "__main__":
    main()
